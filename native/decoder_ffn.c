/* The FFN of the decoder families (see decoder.h). */
#include "decoder.h"

#include <string.h>

/* ---- FFN ---------------------------------------------------------------------------- */

typedef struct {
    const ds4n_dec_dims *d;
    const ds4n_ffn_layer *w;
    const ds4n_dec_batch *b;
    const float *xn;
} ffn_ctx;

static void gate_up_task(void *p, int ith, int nth) {
    const ffn_ctx *c = p;
    const ds4n_ffn_layer *w = c->w;
    const ds4n_dec_batch *b = c->b;
    const int E = c->d->n_embd, F = c->d->n_ff;
    if (!w->gate) {
        ds4n_dec_project_part(w->tup, w->up, 2 * (int64_t)F, E, c->xn, b->count, b->n_seq,
                              b->ws->gu, ith, nth);
        return;
    }
    ds4n_dec_project_part(w->tgate, w->gate, F, E, c->xn, b->count, b->n_seq, b->ws->gate, ith,
                          nth);
    ds4n_dec_project_part(w->tup, w->up, F, E, c->xn, b->count, b->n_seq, b->ws->gu, ith, nth);
}

static void act_rows(float *g, const float *u, int64_t n, int act) {
    if (act == DS4N_ACT_GELU_TANH)
        ds4n_geglu(g, u, n);
    else
        ds4n_swiglu(g, u, n);
}

typedef struct {
    const ds4n_dec_batch *b;
    float *g;
    const float *u;
    int64_t F;
    int act;
} act_ctx;

/* Each sequence's values are cut exactly as they are when it runs alone (whole for one
 * token, else into 8-aligned shares of the workers), so the vector kernels see the same
 * lanes and tails. A one-token sequence goes whole to one worker. */
static void act_task(void *p, int ith, int nth) {
    const act_ctx *c = p;
    const ds4n_dec_batch *b = c->b;
    for (int i = 0; i < b->n_seq; i++) {
        const int64_t base = b->row0[i] * c->F, n = b->count[i] * c->F;
        if (b->count[i] == 1) {
            if (i % nth == ith) act_rows(c->g + base, c->u + base, n, c->act);
            continue;
        }
        const int64_t per = (n / nth + 7) / 8 * 8;
        const int64_t a = per * ith, e = a + per < n ? a + per : n;
        if (a < e) act_rows(c->g + base + a, c->u + base + a, e - a, c->act);
    }
}

void ds4n_ffn(const ds4n_dec_dims *d, const ds4n_ffn_layer *w, const ds4n_dec_batch *b,
              ds4n_pool *pool, const float *xn, float *out) {
    const int64_t F = d->n_ff, T = b->n_rows;
    ds4n_dec_ws *ws = b->ws;
    ffn_ctx fc = {.d = d, .w = w, .b = b, .xn = xn};
    ds4n_dec_run(pool, gate_up_task, &fc);
    if (!w->gate) {
        /* Fused rows [gate | up] per token: the gate halves gathered, then one pass. */
        for (int64_t t = 0; t < T; t++)
            memcpy(ws->gate + t * F, ws->gu + t * 2 * F, sizeof(float) * F);
        for (int64_t t = 0; t < T; t++)
            memmove(ws->gu + t * F, ws->gu + t * 2 * F + F, sizeof(float) * F);
    }
    act_ctx c = {.b = b, .g = ws->gate, .u = ws->gu, .F = F, .act = w->act};
    if (T == 1)
        act_task(&c, 0, 1);
    else
        ds4n_dec_run(pool, act_task, &c);
    ds4n_dec_project(pool, w->tdown, w->down, d->n_embd, F, ws->gate, b->count, b->n_seq, out);
}
