/* Paired whole-token A/B of two library builds: decode_matvecs.c's replay of a decode token's
 * matvecs (same shapes, type mix and dispatches), run token after token with library A, then
 * with B, in one process over the same weights (dlopen, each build its own pool). The median
 * of the tokens' time ratios compares the builds under the same conditions, which on a
 * shared machine two separate runs cannot (matvec_ab.c says why). It checks that both give
 * the same logits.
 *
 *   cc -O2 -I native -o /tmp/decode_ab scripts/figures/decode_ab.c -ldl
 *   /tmp/decode_ab A/libds4n.so B/libds4n.so 1.5b|1.7b|8b THREADS LIMBS TOKENS
 *
 * One thread: its CPU time; more: wall time. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "figure_util.h"

#include "ds4n.h"

struct build {
    void (*run)(ds4n_pool *, void (*)(void *, int, int), void *);
    void (*part)(int, const void *, int64_t, int64_t, const float *, int64_t, float *, int, int);
    ds4n_pool *pool;
};

static const struct build *cur; /* the build the running token uses */

struct mat {
    int type;
    int64_t rows, K;
    void *w;
};

static int64_t mat_bytes(const struct mat *m) {
    return m->rows * (m->K / 256) * (m->type == DS4N_Q4_K ? 144 : 210); /* Q4_K, Q6_K */
}

static void fill(struct mat *m) {
    m->w = fig_weights(m->type, mat_bytes(m), m->type == DS4N_Q4_K ? 144 : 210);
}

struct job {
    const struct mat *m[3];
    int n;
    const float *x;
    float *y[3];
};

static void task(void *ctx, int ith, int nth) {
    const struct job *j = ctx;
    for (int i = 0; i < j->n; i++)
        cur->part(j->m[i]->type, j->m[i]->w, j->m[i]->rows, j->m[i]->K, j->x, 1, j->y[i], ith,
                  nth);
}

static struct build load(const char *path, int threads, int limbs) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "%s\n", dlerror());
        exit(1);
    }
    ds4n_pool *(*pool_new)(int) = (ds4n_pool * (*)(int)) dlsym(h, "ds4n_pool_new");
    int (*set_precision)(ds4n_pool *, int) =
        (int (*)(ds4n_pool *, int))dlsym(h, "ds4n_pool_set_precision");
    struct build b = {
        (void (*)(ds4n_pool *, void (*)(void *, int, int), void *))dlsym(h, "ds4n_pool_run"),
        (void (*)(int, const void *, int64_t, int64_t, const float *, int64_t, float *, int,
                  int))dlsym(h, "ds4n_matmul_part"),
        pool_new(threads)};
    if (set_precision(b.pool, limbs) < 0) {
        fprintf(stderr, "bad limbs %d\n", limbs);
        exit(2);
    }
    return b;
}

/* One token's matvecs on build b: Q/K/V, O, gate+up, down per layer, then the head. */
static void token(const struct build *b, struct mat (*ly)[7], int L, const struct mat *head,
                  const float *x, float *buf[3], float *logits) {
    cur = b;
    for (int i = 0; i < L; i++) {
        struct job jq = {{&ly[i][0], &ly[i][1], &ly[i][2]}, 3, x, {buf[0], buf[1], buf[2]}};
        struct job jo = {{&ly[i][3]}, 1, x, {buf[0]}};
        struct job jg = {{&ly[i][4], &ly[i][5]}, 2, x, {buf[0], buf[1]}};
        struct job jd = {{&ly[i][6]}, 1, x, {buf[2]}};
        b->run(b->pool, task, &jq);
        b->run(b->pool, task, &jo);
        b->run(b->pool, task, &jg);
        b->run(b->pool, task, &jd);
    }
    struct job jh = {{head}, 1, x, {logits}};
    b->run(b->pool, task, &jh);
}

int main(int argc, char **argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: decode_ab A.so B.so 1.5b|1.7b|8b THREADS LIMBS TOKENS\n");
        return 2;
    }
    int E, L, KV, F, V;
    if (!strcmp(argv[3], "1.5b")) E = 1536, L = 28, KV = 256, F = 8960, V = 151936;
    else if (!strcmp(argv[3], "1.7b")) E = 2048, L = 24, KV = 2048, F = 8192, V = 49152;
    else if (!strcmp(argv[3], "8b")) E = 4096, L = 36, KV = 1024, F = 12288, V = 151936;
    else return fprintf(stderr, "unknown shape %s\n", argv[3]), 2;
    const int threads = atoi(argv[4]), limbs = atoi(argv[5]), tokens = atoi(argv[6]);
    if (tokens < 1) return 2;
    const struct build builds[2] = {load(argv[1], threads, limbs), load(argv[2], threads, limbs)};
    srand(1);
    struct mat (*ly)[7] = calloc((size_t)L, sizeof *ly);
    int64_t total = 0;
    for (int i = 0; i < L; i++) {
        const int hi = fig_more_bits(i, L) ? DS4N_Q6_K : DS4N_Q4_K;
        const struct mat m[7] = {{DS4N_Q4_K, E, E, 0}, {DS4N_Q4_K, KV, E, 0}, {hi, KV, E, 0},
                                 {DS4N_Q4_K, E, E, 0}, {DS4N_Q4_K, F, E, 0},  {DS4N_Q4_K, F, E, 0},
                                 {hi, E, F, 0}};
        for (int j = 0; j < 7; j++) {
            ly[i][j] = m[j];
            fill(&ly[i][j]);
            total += mat_bytes(&ly[i][j]);
        }
    }
    struct mat head = {DS4N_Q6_K, V, E, 0};
    fill(&head);
    total += mat_bytes(&head);
    float *x = malloc(sizeof(float) * (size_t)F), *buf[3], *logits[2];
    for (int i = 0; i < F; i++) x[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    for (int i = 0; i < 3; i++) buf[i] = malloc(sizeof(float) * (size_t)F);
    for (int a = 0; a < 2; a++) logits[a] = malloc(sizeof(float) * (size_t)V);
    double *t[2] = {malloc(sizeof(double) * (size_t)tokens), malloc(sizeof(double) * (size_t)tokens)};
    double *ratio = malloc(sizeof(double) * (size_t)tokens);
    for (int k = -1; k < tokens; k++) /* token -1 warms up */
        for (int a = 0; a < 2; a++) {
            const double t0 = fig_now(threads);
            token(&builds[a], ly, L, &head, x, buf, logits[a]);
            if (k >= 0) t[a][k] = fig_now(threads) - t0;
        }
    if (memcmp(logits[0], logits[1], sizeof(float) * (size_t)V) != 0)
        printf("THE LOGITS DIFFER\n");
    for (int k = 0; k < tokens; k++) ratio[k] = t[0][k] / t[1][k];
    for (int a = 0; a < 2; a++) qsort(t[a], (size_t)tokens, sizeof(double), fig_cmp_double);
    qsort(ratio, (size_t)tokens, sizeof(double), fig_cmp_double);
    const double ma = t[0][tokens / 2], mb = t[1][tokens / 2];
    printf("%s, %d thread(s), limbs %d, %d tokens: A %.1f ms (%.1f GB/s), B %.1f ms (%.1f GB/s); "
           "B / A speed %.2f (quartiles %.2f .. %.2f)\n",
           argv[3], threads, limbs, tokens, 1e3 * ma, (double)total / ma / 1e9, 1e3 * mb,
           (double)total / mb / 1e9, ratio[tokens / 2], ratio[tokens / 4], ratio[3 * tokens / 4]);
    return 0;
}
