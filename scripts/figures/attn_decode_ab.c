/* Paired A/B of two library builds on decode attention alone: one query row per kv head (a
 * model without grouped-query heads, as the 1.7B shape; G query heads per kv head with G > 1)
 * against an f16 KV cache of DEPTH positions in every layer, every layer's heads spread over
 * the build's own pool (an item a head, as decoder_attention.c plans the decode row of a
 * model with that many kv heads; taken in turn here, from a shared counter there), token after
 * token with build A then B in one process over the same cache (dlopen), so both see the same
 * moments of a shared machine. The cache is LAYERS x KV_HEADS x DEPTH x HEAD_DIM x 2 (K and V)
 * halves: far above the caches, read once a token, as a decode step reads it. Prints each
 * build's median token time and GB/s and the median of the per-token ratios, and checks that
 * both builds give the same outputs.
 *
 *   cc -O2 -I native -o /tmp/attn_decode_ab scripts/figures/attn_decode_ab.c -ldl
 *   /tmp/attn_decode_ab A/libds4n.so B/libds4n.so 64 32 1 24 4096 2 31   # the 1.7B at 4096
 *   (HEAD_DIM KV_HEADS G LAYERS DEPTH THREADS TOKENS)
 *
 * One thread: its CPU time; more: wall time. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "figure_util.h"

#include "attention.h"
#include "ds4n.h"

#define MAX_THREADS 16

struct build {
    void (*run)(ds4n_pool *, void (*)(void *, int, int), void *);
    void (*attend)(const ds4n_attn_job *, float *);
    int64_t (*scratch_floats)(int, int);
    ds4n_pool *pool;
};

struct layer_job {
    const struct build *b;
    int hd, heads, G;
    int64_t depth, kbytes, vbytes;
    const char *k, *v; /* this layer's heads, kbytes / vbytes apart */
    const float *q;    /* heads x G x hd */
    float *o;
    float *scratch[MAX_THREADS];
};

static void task(void *ctx, int ith, int nth) {
    const struct layer_job *j = ctx;
    for (int h = ith; h < j->heads; h += nth) {
        const ds4n_attn_job a = {
            .q = j->q + (int64_t)h * j->G * j->hd, .q_stride = (int64_t)j->G * j->hd,
            .o = j->o + (int64_t)h * j->G * j->hd, .o_stride = (int64_t)j->G * j->hd,
            .n_tok = 1, .n_group = j->G, .head_dim = j->hd, .pos0 = j->depth - 1,
            .k = j->k + h * j->kbytes, .v = j->v + h * j->vbytes, .kv_type = DS4N_KV_F16,
            .k0 = 0, .k1 = INT64_MAX};
        j->b->attend(&a, j->scratch[ith]);
    }
}

static struct build load(const char *path, int threads) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "%s\n", dlerror());
        exit(1);
    }
    ds4n_pool *(*pool_new)(int) = (ds4n_pool * (*)(int)) dlsym(h, "ds4n_pool_new");
    struct build b = {
        (void (*)(ds4n_pool *, void (*)(void *, int, int), void *))dlsym(h, "ds4n_pool_run"),
        (void (*)(const ds4n_attn_job *, float *))dlsym(h, "ds4n_attn_run"),
        (int64_t (*)(int, int))dlsym(h, "ds4n_attn_scratch_floats"), pool_new(threads)};
    if (!b.run || !b.attend || !b.scratch_floats || !b.pool) {
        fprintf(stderr, "%s: missing symbols\n", path);
        exit(1);
    }
    return b;
}

/* Random finite halves of either sign, magnitudes about 2^-5 .. 2^2, in fig_weights's
 * huge-page buffer (the halves it writes, positive and small, are drawn again here). */
static void *halves(int64_t n) {
    uint16_t *p = fig_weights(0, n * 2, 2);
    for (int64_t i = 0; i < n; i++)
        p[i] = (uint16_t)((rand() & 1) << 15 | (10 + rand() % 8) << 10 | (rand() & 0x3ff));
    return p;
}

int main(int argc, char **argv) {
    if (argc != 10) {
        fprintf(stderr, "usage: attn_decode_ab A.so B.so HEAD_DIM KV_HEADS G LAYERS DEPTH "
                        "THREADS TOKENS\n");
        return 2;
    }
    const int hd = atoi(argv[3]), heads = atoi(argv[4]), G = atoi(argv[5]), L = atoi(argv[6]);
    const int64_t depth = atoll(argv[7]);
    const int threads = atoi(argv[8]), tokens = atoi(argv[9]);
    if (hd < 16 || hd % 16 || heads < 1 || G < 1 || L < 1 || depth < 1 || threads < 1 ||
        threads > MAX_THREADS || tokens < 1)
        return fprintf(stderr, "bad arguments\n"), 2;
    const struct build builds[2] = {load(argv[1], threads), load(argv[2], threads)};
    srand(1);
    const int64_t vbytes = depth * hd * 2, kbytes = (depth + DS4N_KT - 1) / DS4N_KT * DS4N_KT * hd * 2;
    char *k = halves((int64_t)L * heads * kbytes / 2), *v = halves((int64_t)L * heads * vbytes / 2);
    const int64_t qn = (int64_t)heads * G * hd;
    float *q = malloc(sizeof(float) * (size_t)(qn * L)), *o[2];
    for (int64_t i = 0; i < qn * L; i++) q[i] = ((float)rand() / (float)RAND_MAX - 0.5f) * 0.2f;
    struct layer_job lj[2];
    for (int a = 0; a < 2; a++) {
        o[a] = malloc(sizeof(float) * (size_t)(qn * L));
        lj[a] = (struct layer_job){.b = &builds[a], .hd = hd, .heads = heads, .G = G,
                                   .depth = depth, .kbytes = kbytes, .vbytes = vbytes};
        for (int t = 0; t < threads; t++)
            lj[a].scratch[t] = malloc(sizeof(float) * (size_t)builds[a].scratch_floats(G, hd));
    }
    double *t[2] = {malloc(sizeof(double) * (size_t)tokens), malloc(sizeof(double) * (size_t)tokens)};
    double *ratio = malloc(sizeof(double) * (size_t)tokens);
    for (int n = -1; n < tokens; n++) /* token -1 warms up */
        for (int a = 0; a < 2; a++) {
            const double t0 = fig_now(threads);
            for (int l = 0; l < L; l++) {
                lj[a].k = k + (int64_t)l * heads * kbytes;
                lj[a].v = v + (int64_t)l * heads * vbytes;
                lj[a].q = q + l * qn;
                lj[a].o = o[a] + l * qn;
                builds[a].run(builds[a].pool, task, &lj[a]);
            }
            if (n >= 0) t[a][n] = fig_now(threads) - t0;
        }
    if (memcmp(o[0], o[1], sizeof(float) * (size_t)(qn * L)) != 0) printf("THE OUTPUTS DIFFER\n");
    for (int n = 0; n < tokens; n++) ratio[n] = t[0][n] / t[1][n];
    const double ma = fig_median(t[0], tokens), mb = fig_median(t[1], tokens);
    qsort(ratio, (size_t)tokens, sizeof(double), fig_cmp_double);
    const double bytes = (double)L * heads * (double)(kbytes + vbytes);
    printf("attention hd %d, %d kv heads x G %d, %d layers, depth %lld, %d thread(s), %d tokens: "
           "A %.2f ms (%.1f GB/s), B %.2f ms (%.1f GB/s); B / A speed %.2f (quartiles %.2f .. "
           "%.2f)\n",
           hd, heads, G, L, (long long)depth, threads, tokens, 1e3 * ma, bytes / ma / 1e9,
           1e3 * mb, bytes / mb / 1e9, ratio[tokens / 2], ratio[tokens / 4],
           ratio[3 * tokens / 4]);
    return 0;
}
