/* Shared decoder pieces (see decoder.h), one file per job: decoder_kv.c (the KV cache),
 * decoder_norm.c, decoder_rope.c, decoder_attention.c (the attention block's orchestration),
 * decoder_ffn.c, decoder_session.c (sessions, batches and their workspace); here the pool
 * helper, the batch projections and the weight table. The small per-row ops (norms, RoPE,
 * biases) run on the calling thread: they are a few microseconds next to the matmuls, which
 * run on the pool, as does the attention itself. */
#include "decoder.h"

#include <stdlib.h>
#include <string.h>

#include "quants.h" /* DS4N_SMALL_T */

_Static_assert(DS4N_DEC_SMALL_T >= 1 && DS4N_DEC_SMALL_T <= DS4N_SMALL_T,
               "decode rows merged beyond ds4n_matmul's small-batch path would lose bitwise "
               "equality with T = 1");

void ds4n_dec_run(ds4n_pool *pool, void (*fn)(void *, int, int), void *ctx) {
    if (pool)
        ds4n_pool_run(pool, fn, ctx);
    else
        fn(ctx, 0, 1);
}

/* ---- projections -------------------------------------------------------------------- */

void ds4n_dec_rows_part(int type, const void *W, int64_t rows, int64_t K, const float *X,
                        int64_t n, int small, float *Y, int ith, int nth) {
    if (!small) {
        ds4n_matmul_part(type, W, rows, K, X, n, Y, ith, nth);
        return;
    }
    for (int64_t t = 0; t < n; t += DS4N_DEC_SMALL_T) {
        const int64_t m = n - t < DS4N_DEC_SMALL_T ? n - t : DS4N_DEC_SMALL_T;
        ds4n_matmul_part(type, W, rows, K, X + t * K, m, Y + t * rows, ith, nth);
    }
}

void ds4n_dec_project_part(int type, const void *W, int64_t rows, int64_t K, const float *X,
                           const int64_t *count, int n_seq, float *Y, int ith, int nth) {
    int64_t r0 = 0;
    for (int i = 0; i < n_seq;) {
        /* A longer sequence gets its own call, exactly the call it makes alone; consecutive
         * short ones share calls of decode rows. */
        if (count[i] > DS4N_DEC_SMALL_T) {
            ds4n_matmul_part(type, W, rows, K, X + r0 * K, count[i], Y + r0 * rows, ith, nth);
            r0 += count[i++];
            continue;
        }
        int64_t n = 0;
        for (; i < n_seq && count[i] <= DS4N_DEC_SMALL_T; i++) n += count[i];
        ds4n_dec_rows_part(type, W, rows, K, X + r0 * K, n, 1, Y + r0 * rows, ith, nth);
        r0 += n;
    }
}

typedef struct {
    int type;
    const void *W;
    int64_t rows, K;
    const float *X;
    const int64_t *count;
    int n_seq;
    float *Y;
} project_ctx;

static void project_task(void *p, int ith, int nth) {
    const project_ctx *c = p;
    ds4n_dec_project_part(c->type, c->W, c->rows, c->K, c->X, c->count, c->n_seq, c->Y, ith, nth);
}

void ds4n_dec_project(ds4n_pool *pool, int type, const void *W, int64_t rows, int64_t K,
                      const float *X, const int64_t *count, int n_seq, float *Y) {
    project_ctx c = {type, W, rows, K, X, count, n_seq, Y};
    ds4n_dec_run(pool, project_task, &c);
}

/* ---- weight table ------------------------------------------------------------------- */

int ds4n_dec_weights_init(ds4n_dec_weights *t, int n_global, int n_per_layer, int n_layer,
                          const void *const *tensors, const int32_t *types) {
    *t = (ds4n_dec_weights){0};
    if (n_global < 0 || n_per_layer < 0 || n_layer < 0 ||
        (int64_t)n_per_layer * n_layer > INT32_MAX - n_global)
        return -1;
    const size_t n = (size_t)n_global + (size_t)n_layer * (size_t)n_per_layer;
    t->w = malloc(sizeof(void *) * n);
    t->type = malloc(sizeof(int32_t) * n);
    if (!t->w || !t->type) {
        ds4n_dec_weights_free(t);
        return -1;
    }
    memcpy(t->w, tensors, sizeof(void *) * n);
    memcpy(t->type, types, sizeof(int32_t) * n);
    t->n_global = n_global;
    t->n_per_layer = n_per_layer;
    t->n_layer = n_layer;
    return 0;
}

void ds4n_dec_weights_free(ds4n_dec_weights *t) {
    free(t->w);
    free(t->type);
    *t = (ds4n_dec_weights){0};
}

void ds4n_dec_add_rows(float *x, const float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] += y[i];
}
