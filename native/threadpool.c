/* Persistent worker pool. A forward pass dispatches hundreds of jobs per token, so a dispatch
 * must cost well under a microsecond while the workers are hot: workers spin on a generation
 * counter for a short while after each job, and only then sleep on a condition variable.
 * The caller runs share 0 itself. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "ds4n.h"

#define SPIN_NS 200000 /* how long an idle worker (or the waiting caller) spins before resting */

struct ds4n_pool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mutex;
    pthread_cond_t wake;
    void (*fn)(void *ctx, int ith, int nth);
    void *ctx;
    atomic_uint generation; /* bumped once per run (and once to stop) */
    atomic_int pending;     /* workers still running the current job */
    atomic_int sleepers;    /* workers waiting on `wake` */
    atomic_int stop;
};

struct worker_arg {
    ds4n_pool *pool;
    int ith;
};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Spins until generation differs from seen or SPIN_NS pass; returns the last value read. */
static unsigned spin_for_change(ds4n_pool *pool, unsigned seen) {
    int64_t deadline = 0;
    for (unsigned i = 0;; i++) {
        unsigned g = atomic_load_explicit(&pool->generation, memory_order_acquire);
        if (g != seen) return g;
        if ((i & 255) == 0) {
            int64_t t = now_ns();
            if (deadline == 0) deadline = t + SPIN_NS;
            else if (t > deadline) return g;
        }
        cpu_relax();
    }
}

static void *worker_main(void *p) {
    struct worker_arg arg = *(struct worker_arg *)p;
    free(p);
    ds4n_pool *pool = arg.pool;
    unsigned seen = 0;
    for (;;) {
        unsigned g = spin_for_change(pool, seen);
        if (g == seen) {
            pthread_mutex_lock(&pool->mutex);
            atomic_fetch_add(&pool->sleepers, 1);
            while ((g = atomic_load(&pool->generation)) == seen)
                pthread_cond_wait(&pool->wake, &pool->mutex);
            atomic_fetch_sub(&pool->sleepers, 1);
            pthread_mutex_unlock(&pool->mutex);
        }
        seen = g;
        if (atomic_load(&pool->stop)) break;
        pool->fn(pool->ctx, arg.ith, pool->n_threads);
        atomic_fetch_sub_explicit(&pool->pending, 1, memory_order_release);
    }
    return NULL;
}

/* Publishes a new generation; wakes sleeping workers only if there are any. Together with
 * the worker's "sleepers++ then re-check generation" (both seq_cst) no wake-up is lost. */
static void publish(ds4n_pool *pool) {
    atomic_fetch_add(&pool->generation, 1);
    if (atomic_load(&pool->sleepers) > 0) {
        pthread_mutex_lock(&pool->mutex);
        pthread_cond_broadcast(&pool->wake);
        pthread_mutex_unlock(&pool->mutex);
    }
}

ds4n_pool *ds4n_pool_new(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    ds4n_pool *pool = calloc(1, sizeof *pool);
    if (!pool) return NULL;
    pool->n_threads = n_threads;
    pthread_mutex_init(&pool->mutex, NULL);
    pthread_cond_init(&pool->wake, NULL);
    pool->threads = calloc((size_t)n_threads, sizeof *pool->threads);
    if (!pool->threads) {
        free(pool);
        return NULL;
    }
    for (int i = 1; i < n_threads; i++) {
        struct worker_arg *arg = malloc(sizeof *arg);
        if (arg) *arg = (struct worker_arg){pool, i};
        if (!arg || pthread_create(&pool->threads[i], NULL, worker_main, arg) != 0) {
            free(arg);
            pool->n_threads = i; /* run with the workers we have */
            break;
        }
    }
    return pool;
}

void ds4n_pool_free(ds4n_pool *pool) {
    if (!pool) return;
    atomic_store(&pool->stop, 1);
    publish(pool);
    for (int i = 1; i < pool->n_threads; i++) pthread_join(pool->threads[i], NULL);
    pthread_cond_destroy(&pool->wake);
    pthread_mutex_destroy(&pool->mutex);
    free(pool->threads);
    free(pool);
}

int ds4n_pool_threads(const ds4n_pool *pool) { return pool ? pool->n_threads : 1; }

void ds4n_pool_run(ds4n_pool *pool, void (*fn)(void *ctx, int ith, int nth), void *ctx) {
    if (!pool || pool->n_threads == 1) {
        fn(ctx, 0, 1);
        return;
    }
    pool->fn = fn;
    pool->ctx = ctx;
    atomic_store(&pool->pending, pool->n_threads - 1);
    publish(pool);
    fn(ctx, 0, pool->n_threads);
    /* Workers finish about when we do; if one was preempted, stop burning the core. */
    int64_t deadline = now_ns() + SPIN_NS;
    for (unsigned i = 0; atomic_load_explicit(&pool->pending, memory_order_acquire) > 0; i++) {
        if ((i & 255) == 255 && now_ns() > deadline) sched_yield();
        else cpu_relax();
    }
}
