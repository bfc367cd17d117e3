/* Shared decoder pieces (see decoder.h). The small per-row ops (norms, RoPE, biases) run on
 * the calling thread: they are a few microseconds next to the matmuls, which run on the
 * pool, as does the attention itself. */
#include "decoder.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"

static void *alloc_floats(int64_t n) {
    size_t bytes = ((size_t)n * sizeof(float) + 63) / 64 * 64;
    return aligned_alloc(64, bytes ? bytes : 64);
}

void ds4n_dec_run(ds4n_pool *pool, void (*fn)(void *, int, int), void *ctx) {
    if (pool)
        ds4n_pool_run(pool, fn, ctx);
    else
        fn(ctx, 0, 1);
}

/* ---- KV cache ----------------------------------------------------------------------- */

int ds4n_kv_init(ds4n_kv *kv, int n_layer, int n_head_kv, int head_dim, int64_t n_ctx) {
    memset(kv, 0, sizeof *kv);
    if (n_layer <= 0 || n_head_kv <= 0 || head_dim <= 0 || n_ctx <= 0) return -1;
    kv->n_layer = n_layer;
    kv->n_head_kv = n_head_kv;
    kv->head_dim = head_dim;
    kv->n_ctx = n_ctx;
    kv->n_ctx_pad = (n_ctx + DS4N_KBLOCK - 1) / DS4N_KBLOCK * DS4N_KBLOCK;
    const int64_t n = (int64_t)n_layer * n_head_kv * kv->n_ctx_pad * head_dim;
    /* calloc: untouched positions stay unbacked zero pages, so RSS follows use. */
    kv->k = calloc((size_t)n, sizeof(float));
    kv->v = calloc((size_t)n, sizeof(float));
    if (!kv->k || !kv->v) {
        ds4n_kv_release(kv);
        return -1;
    }
    return 0;
}

void ds4n_kv_release(ds4n_kv *kv) {
    free(kv->k);
    free(kv->v);
    kv->k = kv->v = NULL;
}

int64_t ds4n_kv_bytes(const ds4n_kv *kv) {
    return 2 * (int64_t)kv->n_layer * kv->n_head_kv * kv->n_ctx_pad * kv->head_dim *
           (int64_t)sizeof(float);
}

static int64_t head_floats(const ds4n_kv *kv) { return kv->n_ctx_pad * kv->head_dim; }

float *ds4n_kv_k(const ds4n_kv *kv, int il, int h) {
    return kv->k + ((int64_t)il * kv->n_head_kv + h) * head_floats(kv);
}
float *ds4n_kv_v(const ds4n_kv *kv, int il, int h) {
    return kv->v + ((int64_t)il * kv->n_head_kv + h) * head_floats(kv);
}

/* Offset of (position p, dim d) in a head's K tiles. */
static int64_t k_index(int64_t p, int d, int hd) {
    return (p / DS4N_KT) * hd * DS4N_KT + (int64_t)d * DS4N_KT + p % DS4N_KT;
}

void ds4n_kv_store(ds4n_kv *kv, int il, int64_t pos, const float *k, const float *v) {
    const int hd = kv->head_dim;
    for (int h = 0; h < kv->n_head_kv; h++) {
        float *kt = ds4n_kv_k(kv, il, h) + k_index(pos, 0, hd);
        for (int d = 0; d < hd; d++) kt[(int64_t)d * DS4N_KT] = k[h * hd + d];
        memcpy(ds4n_kv_v(kv, il, h) + pos * hd, v + h * hd, sizeof(float) * hd);
    }
}

/* Rows [start, start + n) of one layer; -1 unless the layer, the side and the range are
 * inside the cache (n <= n_ctx - start, so start + n cannot overflow). */
static int kv_rows_ok(const ds4n_kv *kv, int il, int which, int64_t start, int64_t n) {
    return il >= 0 && il < kv->n_layer && (which == 0 || which == 1) && start >= 0 &&
           start <= kv->n_ctx && n >= 0 && n <= kv->n_ctx - start;
}

int ds4n_kv_get_rows(const ds4n_kv *kv, int il, int which, int64_t start, int64_t n,
                     float *dst) {
    const int hd = kv->head_dim;
    if (!kv_rows_ok(kv, il, which, start, n)) return -1;
    for (int h = 0; h < kv->n_head_kv; h++) {
        float *out = dst + (int64_t)h * n * hd;
        if (which == 1) {
            memcpy(out, ds4n_kv_v(kv, il, h) + start * hd, sizeof(float) * n * hd);
            continue;
        }
        const float *k = ds4n_kv_k(kv, il, h);
        for (int64_t p = 0; p < n; p++)
            for (int d = 0; d < hd; d++) out[p * hd + d] = k[k_index(start + p, d, hd)];
    }
    return 0;
}

int ds4n_kv_set_rows(ds4n_kv *kv, int il, int which, int64_t start, int64_t n,
                     const float *src) {
    const int hd = kv->head_dim;
    if (!kv_rows_ok(kv, il, which, start, n)) return -1;
    for (int h = 0; h < kv->n_head_kv; h++) {
        const float *in = src + (int64_t)h * n * hd;
        if (which == 1) {
            memcpy(ds4n_kv_v(kv, il, h) + start * hd, in, sizeof(float) * n * hd);
            continue;
        }
        float *k = ds4n_kv_k(kv, il, h);
        for (int64_t p = 0; p < n; p++)
            for (int d = 0; d < hd; d++) k[k_index(start + p, d, hd)] = in[p * hd + d];
    }
    return 0;
}

int ds4n_kv_get(const ds4n_kv *kv, int il, int which, int64_t n, float *dst) {
    return ds4n_kv_get_rows(kv, il, which, 0, n, dst);
}

int ds4n_kv_set(ds4n_kv *kv, int il, int which, int64_t n, const float *src) {
    return ds4n_kv_set_rows(kv, il, which, 0, n, src);
}

/* ---- norms -------------------------------------------------------------------------- */

void ds4n_rms_norm(const float *x, const float *w, float *out, int64_t rows, int n, float eps) {
    for (int64_t t = 0; t < rows; t++) {
        const float *xr = x + t * n;
        float *o = out + t * n;
        double ss = 0.0;
        for (int i = 0; i < n; i++) ss += (double)xr[i] * xr[i];
        const float scale = (float)(1.0 / sqrt(ss / n + eps));
        for (int i = 0; i < n; i++) o[i] = xr[i] * scale * w[i];
    }
}

/* ---- RoPE --------------------------------------------------------------------------- */

/* The pair index where YaRN's ramp starts or ends for a rotation count (llama.cpp). */
static float yarn_corr_dim(int n_rot, int n_ctx_orig, float rotations, float base) {
    return n_rot * logf(n_ctx_orig / (rotations * 2 * (float)M_PI)) / (2 * logf(base));
}

int ds4n_rope_init(ds4n_rope *r, const ds4n_rope_params *p) {
    memset(r, 0, sizeof *r);
    if (p->n_rot <= 0 || p->n_rot % 2 || p->n_rot > DS4N_ROPE_MAX_DIMS || !(p->base > 0.0f) ||
        !(p->freq_scale > 0.0f) || (p->mode != DS4N_ROPE_NORMAL && p->mode != DS4N_ROPE_NEOX))
        return -1;
    r->n_rot = p->n_rot;
    r->mode = p->mode;
    r->mscale = p->attn_factor > 0.0f ? p->attn_factor : 1.0f;
    float lo = 0.0f, hi = 0.0f;
    const int yarn = p->ext_factor > 0.0f;
    if (yarn) {
        if (p->n_ctx_orig <= 0 || !(p->beta_fast > 0.0f) || !(p->beta_slow > 0.0f)) return -1;
        lo = yarn_corr_dim(p->n_rot, p->n_ctx_orig, p->beta_fast, p->base);
        hi = yarn_corr_dim(p->n_rot, p->n_ctx_orig, p->beta_slow, p->base);
        if (!p->yarn_exact_range) {
            lo = floorf(lo);
            hi = ceilf(hi);
        }
        lo = fmaxf(0.0f, lo);
        hi = fminf(p->n_rot - 1, hi);
        r->mscale *= 1.0f + 0.1f * logf(1.0f / p->freq_scale);
    }
    for (int i = 0; i < p->n_rot / 2; i++) {
        double f = pow((double)p->base, -2.0 * i / p->n_rot);
        if (yarn) {
            /* Blend of the interpolated (scaled) and the extrapolated (unscaled) rate: the
             * angle is linear in both, so the blend is one rate per pair. */
            if (p->freq_factors) f /= p->freq_factors[i];
            const float y = (i - lo) / fmaxf(0.001f, hi - lo);
            const double mix = (1.0f - fminf(1.0f, fmaxf(0.0f, y))) * p->ext_factor;
            f = f * p->freq_scale * (1.0 - mix) + f * mix;
        } else {
            f *= p->freq_scale;
            if (p->freq_factors) f /= p->freq_factors[i];
        }
        r->inv_freq[i] = (float)f;
    }
    return 0;
}

void ds4n_rope_table(const ds4n_rope *r, int64_t pos0, int64_t T, float *cs) {
    const int half = r->n_rot / 2;
    /* Angles in double: positions reach 10^5 radians and beyond. */
    for (int64_t t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            const double a = (double)(pos0 + t) * r->inv_freq[i];
            float c = (float)cos(a), s = (float)sin(a);
            if (r->mscale != 1.0f) {
                c *= r->mscale;
                s *= r->mscale;
            }
            cs[t * r->n_rot + 2 * i] = c;
            cs[t * r->n_rot + 2 * i + 1] = s;
        }
}

void ds4n_rope_apply(const ds4n_rope *r, float *x, const float *cs, int n_heads, int hd,
                     float scale) {
    const int half = r->n_rot / 2;
    /* NORMAL rotates (x[2i], x[2i+1]); NEOX rotates (x[i], x[i + n_rot/2]). */
    const int neox = r->mode == DS4N_ROPE_NEOX;
    const int stride = neox ? 1 : 2, other = neox ? half : 1;
    for (int h = 0; h < n_heads; h++) {
        float *xh = x + (int64_t)h * hd;
        for (int i = 0; i < half; i++) {
            const float c = cs[2 * i], sn = cs[2 * i + 1];
            float *pa = xh + i * stride, *pb = pa + other;
            const float a = *pa, b = *pb;
            *pa = (a * c - b * sn) * scale;
            *pb = (a * sn + b * c) * scale;
        }
        if (scale != 1.0f)
            for (int i = r->n_rot; i < hd; i++) xh[i] *= scale;
    }
}

/* ---- workspace ---------------------------------------------------------------------- */

/* Attention jobs hold ~48 query rows: enough reuse of each K/V load, small enough to
 * balance across threads. */
#define QROWS 48
/* Split-key plans never exceed this many jobs per thread (see plan_attention). */
#define MAX_SPLIT_ITEMS_PER_THREAD 12

static void free_tok_buffers(ds4n_dec_ws *ws) {
    float **bufs[] = {&ws->q, &ws->kx, &ws->vx, &ws->att, &ws->qkv, &ws->gate, &ws->gu};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) {
        free(*bufs[i]);
        *bufs[i] = NULL;
    }
    for (int i = 0; i < DS4N_WS_ROPES; i++) {
        free(ws->rope_cs[i]);
        ws->rope_cs[i] = NULL;
        ws->rope_of[i] = NULL;
    }
    ws->cap_tok = 0;
}

void ds4n_dec_ws_release(ds4n_dec_ws *ws) {
    free_tok_buffers(ws);
    free(ws->attn_scratch);
    free(ws->part);
    memset(ws, 0, sizeof *ws);
}

int ds4n_dec_ws_reserve(ds4n_dec_ws *ws, const ds4n_dec_dims *d, int64_t T, int nth) {
    const int32_t n_q = d->n_head * d->head_dim, n_kv = d->n_head_kv * d->head_dim;
    const int32_t n_rot = d->head_dim < DS4N_ROPE_MAX_DIMS ? d->head_dim : DS4N_ROPE_MAX_DIMS;
    if (T > ws->cap_tok || n_q > ws->cap_q || n_kv > ws->cap_kv || d->n_ff > ws->cap_ff ||
        n_rot > ws->cap_rot) {
        free_tok_buffers(ws);
        ws->q = alloc_floats(T * n_q);
        ws->kx = alloc_floats(T * n_kv);
        ws->vx = alloc_floats(T * n_kv);
        ws->att = alloc_floats(T * n_q);
        ws->qkv = alloc_floats(T * (n_q + 2 * n_kv));
        ws->gate = alloc_floats(T * d->n_ff);
        ws->gu = alloc_floats(T * 2 * d->n_ff);
        int ok = ws->q && ws->kx && ws->vx && ws->att && ws->qkv && ws->gate && ws->gu;
        for (int i = 0; i < DS4N_WS_ROPES; i++) {
            ws->rope_cs[i] = alloc_floats(T * n_rot);
            ok = ok && ws->rope_cs[i];
        }
        if (!ok) {
            free_tok_buffers(ws);
            return -1;
        }
        ws->cap_tok = T;
        ws->cap_q = n_q;
        ws->cap_kv = n_kv;
        ws->cap_ff = d->n_ff;
        ws->cap_rot = n_rot;
    }
    const int G = d->n_head / d->n_head_kv, max_rows = G > QROWS ? G : QROWS;
    const int64_t attn_floats = (ds4n_attn_scratch_floats(max_rows, d->head_dim) + 15) / 16 * 16;
    if (nth > ws->cap_threads || attn_floats > ws->attn_floats) {
        free(ws->attn_scratch);
        ws->attn_floats = attn_floats;
        ws->attn_scratch = alloc_floats(attn_floats * nth);
        ws->cap_threads = ws->attn_scratch ? nth : 0;
        if (!ws->attn_scratch) return -1;
    }
    const int qblock = QROWS / G > 0 ? QROWS / G : 1;
    const int64_t part_floats = (int64_t)MAX_SPLIT_ITEMS_PER_THREAD * nth *
                                ((int64_t)qblock * G * (d->head_dim + 2));
    if (part_floats > ws->cap_part) {
        free(ws->part);
        ws->part = alloc_floats(part_floats);
        ws->cap_part = ws->part ? part_floats : 0;
        if (!ws->part) return -1;
    }
    return 0;
}

const float *ds4n_dec_ws_rope(ds4n_dec_ws *ws, const ds4n_rope *rope, int64_t pos0, int64_t T) {
    for (int i = 0; i < DS4N_WS_ROPES; i++)
        if (ws->rope_of[i] == rope && ws->rope_pos0[i] == pos0 && ws->rope_T[i] == T)
            return ws->rope_cs[i];
    /* This rope's stale table, else a free slot, else (more ropes than slots) the first. */
    int slot = 0;
    for (int i = 0; i < DS4N_WS_ROPES; i++)
        if (ws->rope_of[i] == rope || ws->rope_of[i] == NULL) {
            slot = i;
            break;
        }
    ds4n_rope_table(rope, pos0, T, ws->rope_cs[slot]);
    ws->rope_of[slot] = rope;
    ws->rope_pos0[slot] = pos0;
    ws->rope_T[slot] = T;
    return ws->rope_cs[slot];
}

/* ---- attention ---------------------------------------------------------------------- */

typedef struct {
    const ds4n_dec_dims *d;
    const ds4n_attn_layer *w;
    ds4n_dec_ws *ws;
    const float *xn;
    int64_t T;
} proj_ctx;

static void qkv_task(void *p, int ith, int nth) {
    const proj_ctx *c = p;
    const ds4n_attn_layer *w = c->w;
    const int E = c->d->n_embd, n_q = c->d->n_head * c->d->head_dim,
              n_kv = c->d->n_head_kv * c->d->head_dim;
    if (w->wqkv) {
        ds4n_matmul_part(w->tqkv, w->wqkv, n_q + 2 * n_kv, E, c->xn, c->T, c->ws->qkv, ith, nth);
        return;
    }
    ds4n_matmul_part(w->tq, w->wq, n_q, E, c->xn, c->T, c->ws->q, ith, nth);
    ds4n_matmul_part(w->tk, w->wk, n_kv, E, c->xn, c->T, c->ws->kx, ith, nth);
    ds4n_matmul_part(w->tv, w->wv, n_kv, E, c->xn, c->T, c->ws->vx, ith, nth);
}

/* Attention work: items (query block, kv head, key split), most expensive first, taken
 * from a shared counter so uneven causal blocks balance across threads. */
typedef struct {
    const ds4n_dec_dims *d;
    const ds4n_attn_layer *w;
    ds4n_dec_ws *ws;
    const ds4n_kv *kv;
    int il;
    int64_t T, pos0;
    int qblock, n_qblocks, n_split;
    int64_t kstart, split_len;
    atomic_int next;
} attn_ctx;

static int64_t part_stride(const attn_ctx *c) {
    return (int64_t)c->qblock * (c->d->n_head / c->d->n_head_kv) * c->d->head_dim;
}

static void attn_task(void *p, int ith, int nth) {
    attn_ctx *c = p;
    const ds4n_dec_dims *d = c->d;
    ds4n_dec_ws *ws = c->ws;
    const int hd = d->head_dim, nkv = d->n_head_kv, G = d->n_head / nkv;
    const int64_t n_q = (int64_t)d->n_head * hd;
    const int n_items = c->n_qblocks * nkv * c->n_split;
    float *scratch = ws->attn_scratch + (int64_t)ith * ws->attn_floats;
    for (;;) {
        const int idx = atomic_fetch_add_explicit(&c->next, 1, memory_order_relaxed);
        if (idx >= n_items) break;
        const int qb = c->n_qblocks - 1 - idx / (nkv * c->n_split);
        const int h = idx % (nkv * c->n_split) / c->n_split, sp = idx % c->n_split;
        const int64_t t0 = (int64_t)qb * c->qblock;
        ds4n_attn_job j = {
            .q = ws->q + t0 * n_q + (int64_t)h * G * hd, .q_stride = n_q,
            .o = ws->att + t0 * n_q + (int64_t)h * G * hd, .o_stride = n_q,
            .n_tok = (int)(c->T - t0 < c->qblock ? c->T - t0 : c->qblock),
            .n_group = G, .head_dim = hd, .pos0 = c->pos0 + t0,
            .k = ds4n_kv_k(c->kv, c->il, h), .v = ds4n_kv_v(c->kv, c->il, h),
            .k0 = 0, .k1 = INT64_MAX, .window = c->w->window,
            .sinks = c->w->sinks ? c->w->sinks + (int64_t)h * G : NULL,
        };
        if (c->n_split > 1) {
            const int64_t stride = part_stride(c), rows = (int64_t)c->qblock * G;
            const int64_t n_all = (int64_t)n_items;
            j.k0 = c->kstart + sp * c->split_len;
            j.k1 = j.k0 + c->split_len;
            j.o = ws->part + idx * stride;
            j.o_stride = (int64_t)G * hd;
            j.m = ws->part + n_all * stride + idx * rows;
            j.l = ws->part + n_all * stride + n_all * rows + idx * rows;
        }
        ds4n_attn_run(&j, scratch);
    }
}

/* Combines the split-key partials of every (query block, kv head) into att, adding the
 * heads' sink logits to the denominators. */
static void attn_merge(const attn_ctx *c) {
    const ds4n_dec_dims *d = c->d;
    ds4n_dec_ws *ws = c->ws;
    const int hd = d->head_dim, nkv = d->n_head_kv, G = d->n_head / nkv;
    const int64_t n_q = (int64_t)d->n_head * hd;
    const int64_t n_all = (int64_t)c->n_qblocks * nkv * c->n_split;
    const int64_t stride = part_stride(c), rows = (int64_t)c->qblock * G;
    const float *pm = ws->part + n_all * stride, *pl = pm + n_all * rows;
    for (int qb = 0; qb < c->n_qblocks; qb++) {
        const int64_t t0 = (int64_t)qb * c->qblock;
        const int n_tok = (int)(c->T - t0 < c->qblock ? c->T - t0 : c->qblock);
        for (int h = 0; h < nkv; h++) {
            const int64_t first = ((int64_t)(c->n_qblocks - 1 - qb) * nkv + h) * c->n_split;
            for (int r = 0; r < n_tok * G; r++) {
                float mx = -INFINITY;
                for (int sp = 0; sp < c->n_split; sp++) mx = fmaxf(mx, pm[(first + sp) * rows + r]);
                float *out = ws->att + (t0 + r / G) * n_q + (int64_t)(h * G + r % G) * hd;
                for (int dd = 0; dd < hd; dd++) out[dd] = 0.0f;
                float l = 0.0f;
                for (int sp = 0; sp < c->n_split; sp++) {
                    const float ms = pm[(first + sp) * rows + r];
                    if (ms == -INFINITY) continue;
                    const float w = expf(ms - mx);
                    const float *o = ws->part + (first + sp) * stride + (int64_t)r * hd;
                    l += w * pl[(first + sp) * rows + r];
                    for (int dd = 0; dd < hd; dd++) out[dd] += w * o[dd];
                }
                const float *sink = c->w->sinks ? c->w->sinks + h * G + r % G : NULL;
                const float inv = ds4n_attn_norm_factor(mx, l, sink);
                for (int dd = 0; dd < hd; dd++) out[dd] *= inv;
            }
        }
    }
}

static void plan_attention(attn_ctx *c, int nth) {
    const ds4n_dec_dims *d = c->d;
    const int G = d->n_head / d->n_head_kv;
    c->qblock = QROWS / G > 0 ? QROWS / G : 1;
    c->n_qblocks = (int)((c->T + c->qblock - 1) / c->qblock);
    c->n_split = 1;
    c->split_len = INT64_MAX;
    c->kstart = 0;
    /* A window: the keys of the first query's window onward, from a key-block boundary. */
    if (c->w->window > 0 && c->pos0 - c->w->window + 1 > 0)
        c->kstart = (c->pos0 - c->w->window + 1) / DS4N_KBLOCK * DS4N_KBLOCK;
    const int64_t n_keys = c->pos0 + c->T - c->kstart;
    const int base = c->n_qblocks * d->n_head_kv;
    if (base < 4 * nth && n_keys >= 4 * DS4N_KBLOCK) {
        /* Few query rows (decode): split the keys too, and merge the partial softmaxes.
         * Items: base * n_split <= base * want <= 8 * nth + base < 12 * nth. */
        int want = (8 * nth + base - 1) / base;
        const int64_t max_split = n_keys / (4 * DS4N_KBLOCK);
        if (want > max_split) want = (int)max_split;
        int64_t len = (n_keys + want - 1) / want;
        len = (len + DS4N_KBLOCK - 1) / DS4N_KBLOCK * DS4N_KBLOCK;
        c->split_len = len;
        c->n_split = (int)((n_keys + len - 1) / len);
        if (c->n_split <= 1) {
            c->n_split = 1;
            c->split_len = INT64_MAX;
        }
    }
}

void ds4n_attention(const ds4n_dec_dims *d, const ds4n_attn_layer *w, ds4n_kv *kv, int il,
                    ds4n_dec_ws *ws, ds4n_pool *pool, const float *xn, int64_t T,
                    int64_t pos0, float *out) {
    const int hd = d->head_dim, E = d->n_embd;
    const int n_q = d->n_head * hd, n_kv = d->n_head_kv * hd;
    proj_ctx pc = {.d = d, .w = w, .ws = ws, .xn = xn, .T = T};
    ds4n_dec_run(pool, qkv_task, &pc);
    const float *cs = ds4n_dec_ws_rope(ws, w->rope, pos0, T);
    for (int64_t t = 0; t < T; t++) {
        float *q = ws->q + t * n_q, *k = ws->kx + t * n_kv, *v = ws->vx + t * n_kv;
        if (w->wqkv) {
            const float *row = ws->qkv + t * (n_q + 2 * n_kv);
            memcpy(q, row, sizeof(float) * n_q);
            memcpy(k, row + n_q, sizeof(float) * n_kv);
            memcpy(v, row + n_q + n_kv, sizeof(float) * n_kv);
            if (w->bqkv) {
                for (int i = 0; i < n_q; i++) q[i] += w->bqkv[i];
                for (int i = 0; i < n_kv; i++) k[i] += w->bqkv[n_q + i];
                for (int i = 0; i < n_kv; i++) v[i] += w->bqkv[n_q + n_kv + i];
            }
        }
        if (w->bq) for (int i = 0; i < n_q; i++) q[i] += w->bq[i];
        if (w->bk) for (int i = 0; i < n_kv; i++) k[i] += w->bk[i];
        if (w->bv) for (int i = 0; i < n_kv; i++) v[i] += w->bv[i];
        if (w->q_norm) ds4n_rms_norm(q, w->q_norm, q, d->n_head, hd, d->norm_eps);
        if (w->k_norm) ds4n_rms_norm(k, w->k_norm, k, d->n_head_kv, hd, d->norm_eps);
        ds4n_rope_apply(w->rope, q, cs + t * w->rope->n_rot, d->n_head, hd, w->q_scale);
        ds4n_rope_apply(w->rope, k, cs + t * w->rope->n_rot, d->n_head_kv, hd, 1.0f);
        ds4n_kv_store(kv, il, pos0 + t, k, v);
    }
    const int nth = pool ? ds4n_pool_threads(pool) : 1;
    attn_ctx ac = {.d = d, .w = w, .ws = ws, .kv = kv, .il = il, .T = T, .pos0 = pos0};
    plan_attention(&ac, nth);
    if (ac.n_split > 1 &&
        (int64_t)ac.n_qblocks * d->n_head_kv * ac.n_split * (part_stride(&ac) + 2 * ac.qblock *
         (d->n_head / d->n_head_kv)) > ws->cap_part) {
        ac.n_split = 1; /* never reached by the plan's bound; correct, only slower */
        ac.split_len = INT64_MAX;
        ac.kstart = 0;
    }
    atomic_store(&ac.next, 0);
    ds4n_dec_run(pool, attn_task, &ac);
    if (ac.n_split > 1) attn_merge(&ac);
    ds4n_matmul(pool, w->to, w->wo, E, n_q, ws->att, T, out);
    if (w->bo)
        for (int64_t t = 0; t < T; t++)
            for (int i = 0; i < E; i++) out[t * E + i] += w->bo[i];
}

/* ---- FFN ---------------------------------------------------------------------------- */

typedef struct {
    const ds4n_dec_dims *d;
    const ds4n_ffn_layer *w;
    ds4n_dec_ws *ws;
    const float *xn;
    int64_t T;
} ffn_ctx;

static void gate_up_task(void *p, int ith, int nth) {
    const ffn_ctx *c = p;
    const ds4n_ffn_layer *w = c->w;
    const int E = c->d->n_embd, F = c->d->n_ff;
    if (!w->gate) {
        ds4n_matmul_part(w->tup, w->up, 2 * (int64_t)F, E, c->xn, c->T, c->ws->gu, ith, nth);
        return;
    }
    ds4n_matmul_part(w->tgate, w->gate, F, E, c->xn, c->T, c->ws->gate, ith, nth);
    ds4n_matmul_part(w->tup, w->up, F, E, c->xn, c->T, c->ws->gu, ith, nth);
}

typedef struct {
    float *g;
    const float *u;
    int64_t n;
    int act;
} act_ctx;

static void act_rows(float *g, const float *u, int64_t n, int act) {
    if (act == DS4N_ACT_GELU_TANH)
        ds4n_geglu(g, u, n);
    else
        ds4n_swiglu(g, u, n);
}

static void act_task(void *p, int ith, int nth) {
    const act_ctx *c = p;
    const int64_t per = (c->n / nth + 7) / 8 * 8;
    const int64_t a = per * ith, b = a + per < c->n ? a + per : c->n;
    if (a < b) act_rows(c->g + a, c->u + a, b - a, c->act);
}

void ds4n_ffn(const ds4n_dec_dims *d, const ds4n_ffn_layer *w, ds4n_dec_ws *ws,
              ds4n_pool *pool, const float *xn, int64_t T, float *out) {
    const int64_t F = d->n_ff;
    ffn_ctx fc = {.d = d, .w = w, .ws = ws, .xn = xn, .T = T};
    ds4n_dec_run(pool, gate_up_task, &fc);
    if (!w->gate) {
        /* Fused rows [gate | up] per token: the gate halves gathered, then one pass. */
        for (int64_t t = 0; t < T; t++)
            memcpy(ws->gate + t * F, ws->gu + t * 2 * F, sizeof(float) * F);
        for (int64_t t = 0; t < T; t++)
            memmove(ws->gu + t * F, ws->gu + t * 2 * F + F, sizeof(float) * F);
    }
    act_ctx c = {.g = ws->gate, .u = ws->gu, .n = T * F, .act = w->act};
    if (T == 1)
        act_task(&c, 0, 1);
    else
        ds4n_dec_run(pool, act_task, &c);
    ds4n_matmul(pool, w->tdown, w->down, d->n_embd, F, ws->gate, T, out);
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

/* ---- session ------------------------------------------------------------------------ */

ds4n_dec_session *ds4n_dec_session_new(const ds4n_dec_dims *d, int n_layer, int64_t n_ctx) {
    if (n_ctx <= 0 || d->n_embd <= 0) return NULL;
    ds4n_dec_session *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->dims = *d;
    s->n_ctx = n_ctx;
    if (ds4n_kv_init(&s->kv, n_layer, d->n_head_kv, d->head_dim, n_ctx) != 0) {
        free(s);
        return NULL;
    }
    return s;
}

static void free_rows(ds4n_dec_session *s) {
    free(s->x);
    free(s->xn);
    free(s->tmp);
    s->x = s->xn = s->tmp = NULL;
    s->cap_tok = 0;
}

void ds4n_dec_session_free(ds4n_dec_session *s) {
    if (!s) return;
    free_rows(s);
    ds4n_dec_ws_release(&s->ws);
    ds4n_kv_release(&s->kv);
    free(s);
}

int64_t ds4n_dec_session_n_past(const ds4n_dec_session *s) { return s->n_past; }
int64_t ds4n_dec_session_n_ctx(const ds4n_dec_session *s) { return s->n_ctx; }
int64_t ds4n_dec_session_kv_bytes(const ds4n_dec_session *s) { return ds4n_kv_bytes(&s->kv); }

int ds4n_dec_session_set_n_past(ds4n_dec_session *s, int64_t n) {
    if (n < 0 || n > s->n_ctx) return -1;
    s->n_past = n;
    return 0;
}

int ds4n_dec_session_kv_get(const ds4n_dec_session *s, int il, int which, int64_t start,
                            int64_t n, float *dst) {
    return ds4n_kv_get_rows(&s->kv, il, which, start, n, dst);
}

int ds4n_dec_session_kv_set(ds4n_dec_session *s, int il, int which, int64_t start,
                            int64_t n, const float *src) {
    return ds4n_kv_set_rows(&s->kv, il, which, start, n, src);
}

int ds4n_dec_begin(ds4n_dec_session *s, ds4n_pool *pool, const void *embd, int32_t embd_type,
                   int32_t n_vocab, const int32_t *tokens, int64_t T, float embd_scale) {
    const int E = s->dims.n_embd;
    if (T <= 0) return DS4N_OK;
    if (T > s->n_ctx - s->n_past) return DS4N_ERR_CONTEXT_FULL;
    for (int64_t t = 0; t < T; t++)
        if (tokens[t] < 0 || tokens[t] >= n_vocab) return DS4N_ERR_BAD_TOKEN;
    if (T > s->cap_tok) {
        free_rows(s);
        s->x = alloc_floats(T * E);
        s->xn = alloc_floats(T * E);
        s->tmp = alloc_floats(T * E);
        if (!s->x || !s->xn || !s->tmp) {
            free_rows(s);
            return DS4N_ERR_NO_MEMORY;
        }
        s->cap_tok = T;
    }
    const int nth = pool ? ds4n_pool_threads(pool) : 1;
    if (ds4n_dec_ws_reserve(&s->ws, &s->dims, T, nth) != 0) return DS4N_ERR_NO_MEMORY;
    const int64_t row_bytes = E / ds4n_type_block_size(embd_type) * ds4n_type_block_bytes(embd_type);
    for (int64_t t = 0; t < T; t++) {
        float *x = s->x + t * E;
        ds4n_dequantize(embd_type, (const char *)embd + tokens[t] * row_bytes, x, E);
        if (embd_scale != 1.0f)
            for (int i = 0; i < E; i++) x[i] *= embd_scale;
    }
    return DS4N_OK;
}

void ds4n_dec_finish(ds4n_dec_session *s, ds4n_pool *pool, const float *norm_w, float eps,
                     const void *head, int32_t head_type, int32_t n_vocab, int64_t T,
                     float *logits, int all_logits, float softcap) {
    const int E = s->dims.n_embd;
    if (T <= 0) return;
    s->n_past += T;
    if (!logits) return;
    const int64_t first = all_logits ? 0 : T - 1, rows = T - first;
    ds4n_rms_norm(s->x + first * E, norm_w, s->xn, rows, E, eps);
    ds4n_matmul(pool, head_type, head, n_vocab, E, s->xn, rows, logits);
    if (softcap > 0.0f)
        for (int64_t i = 0; i < rows * n_vocab; i++)
            logits[i] = softcap * tanhf(logits[i] / softcap);
}
