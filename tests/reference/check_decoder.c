/* Checks the decoder's attention step (native/decoder.c) where the families' tests cannot
 * reach it: the split-key decode plan and its merge, with sliding windows and attention
 * sinks, at several thread counts, over each KV element type. After each ds4n_attention call
 * the rotated query rows (ws.q) and the cached keys and values (ds4n_kv_get, read back as
 * the values the cache holds) are taken, the attention output is recomputed by the
 * textbook definition in double, and compared with ws.att. Each call is a batch of one
 * session whose "embedding table" is the input rows themselves (token t = row t).
 * Built against libds4n.so and run by tests/engine/test_dense_families.py.
 * Prints the largest difference; exits 1 when it exceeds the bound. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "decoder.h"

enum { E = 32, NH = 4, NKV = 1, HD = 32, NCTX = 700 }; /* HD: whole q8_0 blocks */

static float frand(void) { return (float)rand() / RAND_MAX * 2.0f - 1.0f; }

static float *random_floats(int n, float scale) {
    float *a = malloc(sizeof(float) * n);
    for (int i = 0; i < n; i++) a[i] = frand() * scale;
    return a;
}

/* max |ws.att - definition| over the T query rows of the last call at positions pos0.. */
static double check(const ds4n_kv *kv, const ds4n_dec_ws *ws, const ds4n_attn_layer *w,
                    int64_t pos0, int T) {
    const int64_t n = pos0 + T;
    float *K = malloc(sizeof(float) * NKV * n * HD), *V = malloc(sizeof(float) * NKV * n * HD);
    char *rows = malloc((size_t)(NKV * n * kv->row_bytes));
    for (int which = 0; which < 2; which++) {
        ds4n_kv_get(kv, 0, which, n, rows);
        for (int64_t i = 0; i < NKV * n; i++)
            for (int d = 0; d < HD; d++)
                (which ? V : K)[i * HD + d] =
                    ds4n_kv_row_at(kv->type, rows + i * kv->row_bytes, d);
    }
    free(rows);
    double worst = 0.0;
    for (int t = 0; t < T; t++) {
        const int64_t pos = pos0 + t;
        int64_t lo = 0;
        if (w->window > 0 && pos - w->window + 1 > 0) lo = pos - w->window + 1;
        for (int h = 0; h < NH; h++) {
            const int hk = h / (NH / NKV);
            const float *q = ws->q + (int64_t)t * NH * HD + h * HD;
            double mx = w->sinks ? w->sinks[h] : -INFINITY, sum = 0.0, out[HD] = {0};
            for (int64_t p = lo; p <= pos; p++) {
                double s = 0.0;
                for (int d = 0; d < HD; d++) s += (double)q[d] * K[(hk * n + p) * HD + d];
                if (s > mx) mx = s;
            }
            if (w->sinks) sum = exp(w->sinks[h] - mx);
            for (int64_t p = lo; p <= pos; p++) {
                double s = 0.0;
                for (int d = 0; d < HD; d++) s += (double)q[d] * K[(hk * n + p) * HD + d];
                const double e = exp(s - mx);
                sum += e;
                for (int d = 0; d < HD; d++) out[d] += e * V[(hk * n + p) * HD + d];
            }
            const float *got = ws->att + (int64_t)t * NH * HD + h * HD;
            for (int d = 0; d < HD; d++) worst = fmax(worst, fabs(got[d] - out[d] / sum));
        }
    }
    free(K);
    free(V);
    return worst;
}

/* One attention call over T new tokens of session s (a batch of one), then n_past += T. */
static int step(ds4n_dec_session *s, const ds4n_attn_layer *w, ds4n_pool *pool,
                const float *table, const int32_t *tokens, int64_t T, float *out) {
    ds4n_dec_batch b;
    ds4n_dec_session *const seq[1] = {s};
    if (ds4n_dec_batch_begin(&b, &s->dims, 1, seq, 1, &T, pool, table, DS4N_F32, 300, tokens,
                             1.0f) != DS4N_OK)
        return 1;
    ds4n_attention(&s->dims, w, 0, &b, pool, b.x, out);
    ds4n_dec_batch_finish(&b, pool, NULL, 0.0f, NULL, DS4N_F32, 0, NULL, NULL, 0.0f);
    return 0;
}

int main(void) {
    srand(11);
    int32_t tokens[300];
    for (int i = 0; i < 300; i++) tokens[i] = i;
    float *wq = random_floats(NH * HD * E, 0.5f), *wk = random_floats(NKV * HD * E, 0.5f);
    float *wv = random_floats(NKV * HD * E, 0.5f), *wo = random_floats(E * NH * HD, 0.2f);
    float *x = random_floats(300 * E, 1.0f), *out = malloc(sizeof(float) * 300 * E);
    const float sinks[NH] = {0.5f, -2.0f, 3.0f, 1.0f};
    const ds4n_dec_dims dims = {.n_embd = E, .n_head = NH, .n_head_kv = NKV, .head_dim = HD,
                                .n_ff = 0, .norm_eps = 1e-6f};
    ds4n_rope rope;
    const ds4n_rope_params rp = {.n_rot = HD, .mode = DS4N_ROPE_NEOX, .base = 10000.0f,
                                 .freq_scale = 1.0f};
    if (ds4n_rope_init(&rope, &rp) != 0) return 1;
    const struct { int64_t window; int sinks, threads; } cases[] = {
        {0, 0, 1}, {0, 1, 2}, {100, 0, 2}, {100, 1, 1}, {300, 1, 2}, {17, 1, 2}, {0, 1, 4},
    };
    double worst = 0.0;
    for (int kvt = DS4N_KV_F32; kvt <= DS4N_KV_Q8_0; kvt++) {
        for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
            ds4n_pool *pool = cases[c].threads > 1 ? ds4n_pool_new(cases[c].threads) : NULL;
            const ds4n_attn_layer w = {.wq = wq, .wk = wk, .wv = wv, .wo = wo,
                                       .tq = DS4N_F32, .tk = DS4N_F32, .tv = DS4N_F32,
                                       .to = DS4N_F32, .rope = &rope, .q_scale = 0.25f,
                                       .window = cases[c].window,
                                       .sinks = cases[c].sinks ? sinks : NULL};
            ds4n_dec_session *s = ds4n_dec_session_new(&dims, 1, NCTX, kvt);
            if (!s) return 1;
            /* Prefill 300 positions in two uneven chunks, then decode (split keys) to 640. */
            int64_t pos = 0;
            const int64_t chunks[] = {130, 170};
            for (int i = 0; i < 2; i++) {
                if (step(s, &w, pool, x, tokens + pos, chunks[i], out) != 0) return 1;
                worst = fmax(worst, check(&s->kv, &s->ws, &w, pos, (int)chunks[i]));
                pos += chunks[i];
            }
            for (; pos < 640; pos++) {
                const int32_t token = (int32_t)(pos % 300);
                if (step(s, &w, pool, x, &token, 1, out) != 0) return 1;
                if (pos % 17 == 0 || pos >= 630)
                    worst = fmax(worst, check(&s->kv, &s->ws, &w, pos, 1));
            }
            ds4n_dec_session_free(s);
            if (pool) ds4n_pool_free(pool);
        }
    }
    free(wq), free(wk), free(wv), free(wo), free(x), free(out);
    printf("decoder attention (split keys, windows, sinks; f32, f16, q8_0 KV) vs definition:"
           " max |diff| %.3g\n",
           worst);
    return worst < 1e-4 ? 0 : 1;
}
