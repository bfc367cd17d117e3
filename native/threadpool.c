/* Persistent worker pool. A forward pass dispatches hundreds of jobs per token, so a dispatch
 * must cost well under a microsecond while the workers are hot: idle workers spin on a job
 * word for a short while after each job, and only then sleep on a condition variable.
 *
 * Shares are claimed, not assigned: the caller and the workers take share indices from one
 * atomic counter. When every worker is awake each takes one share, as with a static split;
 * when the machine is oversubscribed and a worker is not running, the caller takes its share
 * instead of waiting for the scheduler to bring that worker back. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ds4n.h"
#include "profile.h"
#include "quants_int.h"

#define SPIN_NS 200000 /* how long an idle worker spins before sleeping */
#define CLAIM_BITS 16  /* job word: generation << CLAIM_BITS | next share to claim */

struct ds4n_pool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mutex;
    pthread_cond_t wake;
    void (*fn)(void *ctx, int ith, int nth);
    void *ctx;
    _Alignas(64) _Atomic uint64_t job; /* generation << CLAIM_BITS | shares claimed */
    _Alignas(64) atomic_int done;          /* shares of the current job finished */
    atomic_int sleepers;                   /* workers waiting on `wake` */
    atomic_int stop;
    struct ds4n_prof_log *logs;            /* per thread, for the decode profile */
    int limbs;                             /* precision of its matmuls: 0 exact, 2 or 3 */
};

/* The running job's pool's limbs, on each thread while it runs a share. */
static _Thread_local int thread_limbs;
int ds4n_thread_limbs(void) { return thread_limbs; }

struct worker_arg {
    ds4n_pool *pool;
    int index;
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

static inline uint64_t generation(uint64_t job) { return job >> CLAIM_BITS; }

/* Claims and runs shares of job generation gen until none is left. */
static void run_shares(ds4n_pool *pool, uint64_t gen) {
    const int nth = pool->n_threads;
    uint64_t job = atomic_load(&pool->job);
    while (generation(job) == gen && (int)(job & ((1u << CLAIM_BITS) - 1)) < nth) {
        if (!atomic_compare_exchange_weak(&pool->job, &job, job + 1)) continue;
        /* The job cannot finish while we hold a share, so fn and ctx are this job's. */
        thread_limbs = pool->limbs;
        if (ds4n_profile_on()) {
            struct ds4n_prof_log *log = ds4n_profile_log();
            const int64_t t0 = ds4n_now_ns();
            pool->fn(pool->ctx, (int)(job & ((1u << CLAIM_BITS) - 1)), nth);
            if (log) {
                if (log->shares++ == 0) log->first_ns = t0;
                log->share_ns += ds4n_now_ns() - t0;
            }
        } else {
            pool->fn(pool->ctx, (int)(job & ((1u << CLAIM_BITS) - 1)), nth);
        }
        thread_limbs = 0;
        atomic_fetch_add_explicit(&pool->done, 1, memory_order_release);
        job = atomic_load(&pool->job);
    }
}

/* Waits for a generation other than seen: spins (yielding the core to anyone runnable) for
 * SPIN_NS, then sleeps. */
static uint64_t wait_for_job(ds4n_pool *pool, uint64_t seen) {
    int64_t deadline = 0;
    for (unsigned i = 0;; i++) {
        uint64_t gen = generation(atomic_load_explicit(&pool->job, memory_order_acquire));
        if (gen != seen) return gen;
        if ((i & 63) == 63) {
            int64_t t = now_ns();
            if (deadline == 0) deadline = t + SPIN_NS;
            else if (t > deadline) break;
            sched_yield();
        }
        cpu_relax();
    }
    uint64_t gen;
    pthread_mutex_lock(&pool->mutex);
    atomic_fetch_add(&pool->sleepers, 1);
    while ((gen = generation(atomic_load(&pool->job))) == seen)
        pthread_cond_wait(&pool->wake, &pool->mutex);
    atomic_fetch_sub(&pool->sleepers, 1);
    pthread_mutex_unlock(&pool->mutex);
    return gen;
}

static void *worker_main(void *arg) {
    struct worker_arg a = *(struct worker_arg *)arg;
    free(arg);
    ds4n_pool *pool = a.pool;
    ds4n_profile_set_log(&pool->logs[a.index]);
    uint64_t seen = 0;
    for (;;) {
        seen = wait_for_job(pool, seen);
        if (atomic_load(&pool->stop)) break;
        run_shares(pool, seen);
    }
    return NULL;
}

/* Starts a new generation with no share claimed; wakes sleeping workers only if there are
 * any. With the worker's "sleepers++ then re-check" (both seq_cst) no wake-up is lost. */
static uint64_t publish(ds4n_pool *pool) {
    uint64_t job = atomic_load(&pool->job);
    uint64_t next = (generation(job) + 1) << CLAIM_BITS;
    atomic_store(&pool->job, next);
    if (atomic_load(&pool->sleepers) > 0) {
        pthread_mutex_lock(&pool->mutex);
        pthread_cond_broadcast(&pool->wake);
        pthread_mutex_unlock(&pool->mutex);
    }
    return generation(next);
}

ds4n_pool *ds4n_pool_new(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    if (n_threads > 1024) n_threads = 1024; /* shares must fit the claim bits */
    /* The struct's cache-line-aligned members need an aligned block (calloc gives 16). */
    ds4n_pool *pool = aligned_alloc(_Alignof(ds4n_pool), sizeof *pool);
    if (!pool) return NULL;
    memset(pool, 0, sizeof *pool);
    pool->threads = calloc((size_t)n_threads, sizeof *pool->threads);
    pool->logs = calloc((size_t)n_threads, sizeof *pool->logs);
    if (!pool->threads || !pool->logs) {
        free(pool->threads);
        free(pool->logs);
        free(pool);
        return NULL;
    }
    pthread_mutex_init(&pool->mutex, NULL);
    pthread_cond_init(&pool->wake, NULL);
    pool->n_threads = n_threads;
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
    free(pool->logs);
    free(pool);
}

int ds4n_pool_threads(const ds4n_pool *pool) { return pool ? pool->n_threads : 1; }

int ds4n_pool_set_precision(ds4n_pool *pool, int limbs) {
    if (!pool || (limbs != 0 && limbs != 2 && limbs != 3)) return -1;
    pool->limbs = limbs;
    return limbs;
}

static void run_jobs(ds4n_pool *pool, void (*fn)(void *ctx, int ith, int nth), void *ctx);

void ds4n_pool_run(ds4n_pool *pool, void (*fn)(void *ctx, int ith, int nth), void *ctx) {
    if (!pool || !ds4n_profile_on()) {
        run_jobs(pool, fn, ctx);
        return;
    }
    ds4n_profile_set_log(&pool->logs[0]); /* the caller's: whichever thread calls */
    const int64_t t0 = ds4n_now_ns();
    run_jobs(pool, fn, ctx);
    ds4n_profile_dispatch(pool->logs, pool->n_threads, t0, ds4n_now_ns());
    ds4n_profile_set_log(NULL);
}

static void run_jobs(ds4n_pool *pool, void (*fn)(void *ctx, int ith, int nth), void *ctx) {
    if (!pool || pool->n_threads == 1) {
        thread_limbs = pool ? pool->limbs : 0;
        if (pool && ds4n_profile_on()) {
            const int64_t t0 = ds4n_now_ns();
            fn(ctx, 0, 1);
            pool->logs[0].shares = 1, pool->logs[0].first_ns = t0;
            pool->logs[0].share_ns += ds4n_now_ns() - t0;
        } else {
            fn(ctx, 0, 1);
        }
        thread_limbs = 0;
        return;
    }
    pool->fn = fn;
    pool->ctx = ctx;
    atomic_store(&pool->done, 0);
    run_shares(pool, publish(pool));
    /* Every share is claimed; wait for those workers took (they are running them now). */
    for (unsigned i = 0; atomic_load_explicit(&pool->done, memory_order_acquire) < pool->n_threads; i++) {
        if ((i & 255) == 255) sched_yield();
        else cpu_relax();
    }
}
