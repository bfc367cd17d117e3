/* Checks the decoder's attention step (native/decoder.c) where the families' tests cannot
 * reach it: the split-key decode plan and its merge, with sliding windows and attention
 * sinks, at several thread counts. After each ds4n_attention call the rotated query rows
 * (ws.q) and the cached keys and values (ds4n_kv_get) are taken, the attention output is
 * recomputed by the textbook definition in double, and compared with ws.att.
 * Built against libds4n.so and run by tests/test_dense_families.py.
 * Prints the largest difference; exits 1 when it exceeds the bound. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "decoder.h"

enum { E = 32, NH = 4, NKV = 1, HD = 16, NCTX = 700 };

static float frand(void) { return (float)rand() / RAND_MAX * 2.0f - 1.0f; }

static float *random_floats(int n, float scale) {
    float *a = malloc(sizeof(float) * n);
    for (int i = 0; i < n; i++) a[i] = frand() * scale;
    return a;
}

/* max |ws.att - definition| over the T query rows of the last call at positions pos0.. */
/* ds4n_attention over a batch of one sequence at pos on kv (layer 0). */
static void attend(const ds4n_dec_dims *d, const ds4n_attn_layer *w, ds4n_kv *kv,
                   ds4n_dec_ws *ws, ds4n_pool *pool, const float *x, int64_t T, int64_t pos,
                   float *out) {
    ds4n_dec_session s = {.dims = *d, .n_ctx = kv->n_ctx, .n_past = pos, .kv = *kv};
    ds4n_dec_session *sp = &s;
    const int64_t count = T;
    ds4n_dec_batch b = {.n_seq = 1, .seq = &sp, .count = &count, .n_rows = T, .ws = ws};
    b.pos0[0] = pos;
    ws->call++; /* a new call: its rope tables are made afresh */
    ds4n_attention(d, w, 0, &b, pool, x, out);
}

static double check(const ds4n_kv *kv, const ds4n_dec_ws *ws, const ds4n_attn_layer *w,
                    int64_t pos0, int T) {
    const int64_t n = pos0 + T;
    float *K = malloc(sizeof(float) * NKV * n * HD), *V = malloc(sizeof(float) * NKV * n * HD);
    ds4n_kv_get(kv, 0, 0, n, K);
    ds4n_kv_get(kv, 0, 1, n, V);
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

int main(void) {
    srand(11);
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
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        ds4n_pool *pool = cases[c].threads > 1 ? ds4n_pool_new(cases[c].threads) : NULL;
        const ds4n_attn_layer w = {.wq = wq, .wk = wk, .wv = wv, .wo = wo,
                                   .tq = DS4N_F32, .tk = DS4N_F32, .tv = DS4N_F32,
                                   .to = DS4N_F32, .rope = &rope, .q_scale = 0.25f,
                                   .window = cases[c].window,
                                   .sinks = cases[c].sinks ? sinks : NULL};
        ds4n_kv kv;
        ds4n_dec_ws ws = {0};
        if (ds4n_kv_init(&kv, 1, NKV, HD, NCTX) != 0 ||
            ds4n_dec_ws_reserve(&ws, &dims, 300, 1, cases[c].threads) != 0)
            return 1;
        /* Prefill 300 positions in two uneven chunks, then decode (split keys) to 640. */
        int64_t pos = 0;
        const int chunks[] = {130, 170};
        for (int i = 0; i < 2; i++) {
            attend(&dims, &w, &kv, &ws, pool, x, chunks[i], pos, out);
            worst = fmax(worst, check(&kv, &ws, &w, pos, chunks[i]));
            pos += chunks[i];
        }
        for (; pos < 640; pos++) {
            attend(&dims, &w, &kv, &ws, pool, x + (pos % 300) * E, 1, pos, out);
            if (pos % 17 == 0 || pos >= 630) worst = fmax(worst, check(&kv, &ws, &w, pos, 1));
        }
        ds4n_dec_ws_release(&ws);
        ds4n_kv_release(&kv);
        if (pool) ds4n_pool_free(pool);
    }
    free(wq), free(wk), free(wv), free(wo), free(x), free(out);
    printf("decoder attention (split keys, windows, sinks) vs definition: max |diff| %.3g\n",
           worst);
    return worst < 1e-4 ? 0 : 1;
}
