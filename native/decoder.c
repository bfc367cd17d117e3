/* Shared decoder pieces (see decoder.h). The small per-row ops (norms, RoPE, biases) run on
 * the calling thread: they are a few microseconds next to the matmuls, which run on the
 * pool, as does the attention itself. */
#include "decoder.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "quants.h" /* DS4N_SMALL_T */

_Static_assert(DS4N_DEC_SMALL_T >= 1 && DS4N_DEC_SMALL_T <= DS4N_SMALL_T,
               "decode rows merged beyond ds4n_matmul's small-batch path would lose bitwise "
               "equality with T = 1");

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

int ds4n_kv_init(ds4n_kv *kv, int n_layer, int n_head_kv, int head_dim, int64_t n_ctx,
                 int type) {
    memset(kv, 0, sizeof *kv);
    const int64_t row = ds4n_kv_row_bytes(type, head_dim);
    if (n_layer <= 0 || n_head_kv <= 0 || row <= 0 || n_ctx <= 0) return -1;
    kv->n_layer = n_layer;
    kv->n_head_kv = n_head_kv;
    kv->head_dim = head_dim;
    kv->type = type;
    kv->row_bytes = row;
    kv->n_ctx = n_ctx;
    kv->n_ctx_pad = (n_ctx + DS4N_KBLOCK - 1) / DS4N_KBLOCK * DS4N_KBLOCK;
    const int64_t n = (int64_t)n_layer * n_head_kv * kv->n_ctx_pad;
    /* calloc: untouched positions stay unbacked zero pages, so RSS follows use. */
    kv->k = calloc((size_t)n, (size_t)row);
    kv->v = calloc((size_t)n, (size_t)row);
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
    return 2 * (int64_t)kv->n_layer * kv->n_head_kv * kv->n_ctx_pad * kv->row_bytes;
}

int64_t ds4n_kv_type_row_bytes(int type, int head_dim) {
    return ds4n_kv_row_bytes(type, head_dim);
}

static int64_t head_bytes(const ds4n_kv *kv) { return kv->n_ctx_pad * kv->row_bytes; }

void *ds4n_kv_k(const ds4n_kv *kv, int il, int h) {
    return kv->k + ((int64_t)il * kv->n_head_kv + h) * head_bytes(kv);
}
void *ds4n_kv_v(const ds4n_kv *kv, int il, int h) {
    return kv->v + ((int64_t)il * kv->n_head_kv + h) * head_bytes(kv);
}

/* The K tile holding position p of a head's cache. */
static char *k_tile(const ds4n_kv *kv, int il, int h, int64_t p) {
    return (char *)ds4n_kv_k(kv, il, h) + p / DS4N_KT * DS4N_KT * kv->row_bytes;
}

void ds4n_kv_store(ds4n_kv *kv, int il, int64_t pos, const float *k, const float *v) {
    const int hd = kv->head_dim;
    for (int h = 0; h < kv->n_head_kv; h++) {
        ds4n_kv_tile_store(kv->type, k + h * hd, hd, k_tile(kv, il, h, pos), (int)(pos % DS4N_KT));
        ds4n_kv_pack_row(kv->type, v + h * hd, hd,
                         (char *)ds4n_kv_v(kv, il, h) + pos * kv->row_bytes);
    }
}

/* Rows [start, start + n) of one layer; -1 unless the layer, the side and the range are
 * inside the cache (n <= n_ctx - start, so start + n cannot overflow). */
static int kv_rows_ok(const ds4n_kv *kv, int il, int which, int64_t start, int64_t n) {
    return il >= 0 && il < kv->n_layer && (which == 0 || which == 1) && start >= 0 &&
           start <= kv->n_ctx && n >= 0 && n <= kv->n_ctx - start;
}

int ds4n_kv_get_rows(const ds4n_kv *kv, int il, int which, int64_t start, int64_t n,
                     void *dst) {
    const int64_t row = kv->row_bytes;
    if (!kv_rows_ok(kv, il, which, start, n)) return -1;
    for (int h = 0; h < kv->n_head_kv; h++) {
        char *out = (char *)dst + (int64_t)h * n * row;
        if (which == 1) {
            memcpy(out, (const char *)ds4n_kv_v(kv, il, h) + start * row, (size_t)(n * row));
            continue;
        }
        for (int64_t p = start; p < start + n; p++)
            ds4n_kv_tile_get(kv->type, k_tile(kv, il, h, p), (int)(p % DS4N_KT), kv->head_dim,
                             out + (p - start) * row);
    }
    return 0;
}

int ds4n_kv_set_rows(ds4n_kv *kv, int il, int which, int64_t start, int64_t n,
                     const void *src) {
    const int64_t row = kv->row_bytes;
    if (!kv_rows_ok(kv, il, which, start, n)) return -1;
    for (int h = 0; h < kv->n_head_kv; h++) {
        const char *in = (const char *)src + (int64_t)h * n * row;
        if (which == 1) {
            memcpy((char *)ds4n_kv_v(kv, il, h) + start * row, in, (size_t)(n * row));
            continue;
        }
        for (int64_t p = start; p < start + n; p++)
            ds4n_kv_tile_put(kv->type, in + (p - start) * row, kv->head_dim,
                             k_tile(kv, il, h, p), (int)(p % DS4N_KT));
    }
    return 0;
}

int ds4n_kv_get(const ds4n_kv *kv, int il, int which, int64_t n, void *dst) {
    return ds4n_kv_get_rows(kv, il, which, 0, n, dst);
}

int ds4n_kv_set(ds4n_kv *kv, int il, int which, int64_t n, const void *src) {
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

int ds4n_dec_ws_reserve(ds4n_dec_ws *ws, const ds4n_dec_dims *d, int64_t T, int n_seq,
                        int nth) {
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
    /* Each sequence's split-key partials have a region of their own: one dispatch runs the
     * attention of every sequence. */
    const int64_t part_floats = (int64_t)n_seq * MAX_SPLIT_ITEMS_PER_THREAD * nth *
                                ((int64_t)qblock * G * (d->head_dim + 2));
    if (part_floats > ws->cap_part) {
        free(ws->part);
        ws->part = alloc_floats(part_floats);
        ws->cap_part = ws->part ? part_floats : 0;
        if (!ws->part) return -1;
    }
    return 0;
}

const float *ds4n_dec_ws_rope(const ds4n_dec_batch *b, const ds4n_rope *rope) {
    ds4n_dec_ws *ws = b->ws;
    for (int i = 0; i < DS4N_WS_ROPES; i++)
        if (ws->rope_of[i] == rope && ws->rope_call[i] == ws->call) return ws->rope_cs[i];
    /* This rope's stale table, else a free or stale slot, else (more ropes than slots in one
     * call) the first. */
    int slot = 0;
    for (int i = 0; i < DS4N_WS_ROPES; i++)
        if (ws->rope_of[i] == rope || ws->rope_of[i] == NULL || ws->rope_call[i] != ws->call) {
            slot = i;
            break;
        }
    for (int i = 0; i < b->n_seq; i++)
        ds4n_rope_table(rope, b->pos0[i], b->count[i], ws->rope_cs[slot] + b->row0[i] * rope->n_rot);
    ws->rope_of[slot] = rope;
    ws->rope_call[slot] = ws->call;
    return ws->rope_cs[slot];
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

/* ---- attention ---------------------------------------------------------------------- */

typedef struct {
    const ds4n_dec_dims *d;
    const ds4n_attn_layer *w;
    const ds4n_dec_batch *b;
    ds4n_dec_ws *ws;
    const float *xn;
} proj_ctx;

static void qkv_task(void *p, int ith, int nth) {
    const proj_ctx *c = p;
    const ds4n_attn_layer *w = c->w;
    const ds4n_dec_batch *b = c->b;
    const int E = c->d->n_embd, n_q = c->d->n_head * c->d->head_dim,
              n_kv = c->d->n_head_kv * c->d->head_dim;
    if (w->wqkv) {
        ds4n_dec_project_part(w->tqkv, w->wqkv, n_q + 2 * n_kv, E, c->xn, b->count, b->n_seq,
                              c->ws->qkv, ith, nth);
        return;
    }
    ds4n_dec_project_part(w->tq, w->wq, n_q, E, c->xn, b->count, b->n_seq, c->ws->q, ith, nth);
    ds4n_dec_project_part(w->tk, w->wk, n_kv, E, c->xn, b->count, b->n_seq, c->ws->kx, ith, nth);
    ds4n_dec_project_part(w->tv, w->wv, n_kv, E, c->xn, b->count, b->n_seq, c->ws->vx, ith, nth);
}

/* One sequence's attention work: items (query block, kv head, key split), most expensive
 * first. Its rows start at row0 of q and att; its split-key partials live at part. */
typedef struct {
    const ds4n_dec_dims *d;
    const ds4n_attn_layer *w;
    const ds4n_kv *kv;
    int il;
    int64_t T, pos0, row0;
    int bidir;
    int qblock, n_qblocks, n_split, n_items;
    int64_t kstart, split_len;
    float *part;
} attn_seq;

/* Every sequence's items, taken from one shared counter so uneven causal blocks and
 * sequences balance across threads in one dispatch. */
typedef struct {
    ds4n_dec_ws *ws;
    int n_seq;
    attn_seq *seq;
    int first[DS4N_DEC_MAX_SEQ + 1]; /* first item of each sequence */
    atomic_int next;
} attn_ctx;

static int64_t part_stride(const attn_seq *c) {
    return (int64_t)c->qblock * (c->d->n_head / c->d->n_head_kv) * c->d->head_dim;
}

static int64_t part_floats(const attn_seq *c) {
    const int G = c->d->n_head / c->d->n_head_kv;
    return (int64_t)c->n_items * (part_stride(c) + 2 * (int64_t)c->qblock * G);
}

static void attn_item(const attn_seq *c, ds4n_dec_ws *ws, int idx, float *scratch) {
    const ds4n_dec_dims *d = c->d;
    const int hd = d->head_dim, nkv = d->n_head_kv, G = d->n_head / nkv;
    const int64_t n_q = (int64_t)d->n_head * hd;
    const int qb = c->n_qblocks - 1 - idx / (nkv * c->n_split);
    const int h = idx % (nkv * c->n_split) / c->n_split, sp = idx % c->n_split;
    const int64_t t0 = (int64_t)qb * c->qblock, r0 = c->row0 + t0;
    ds4n_attn_job j = {
        .q = ws->q + r0 * n_q + (int64_t)h * G * hd, .q_stride = n_q,
        .o = ws->att + r0 * n_q + (int64_t)h * G * hd, .o_stride = n_q,
        .n_tok = (int)(c->T - t0 < c->qblock ? c->T - t0 : c->qblock),
        .n_group = G, .head_dim = hd, .pos0 = c->pos0 + t0,
        .k = ds4n_kv_k(c->kv, c->il, h), .v = ds4n_kv_v(c->kv, c->il, h),
        .kv_type = c->kv->type,
        .k0 = 0, .k1 = INT64_MAX, .window = c->w->window,
        .keys_end = c->bidir ? c->pos0 + c->T : 0,
        .sinks = c->w->sinks ? c->w->sinks + (int64_t)h * G : NULL,
    };
    if (c->n_split > 1) {
        const int64_t stride = part_stride(c), rows = (int64_t)c->qblock * G;
        const int64_t n_all = (int64_t)c->n_items;
        j.k0 = c->kstart + sp * c->split_len;
        j.k1 = j.k0 + c->split_len;
        j.o = c->part + idx * stride;
        j.o_stride = (int64_t)G * hd;
        j.m = c->part + n_all * stride + idx * rows;
        j.l = c->part + n_all * stride + n_all * rows + idx * rows;
    }
    ds4n_attn_run(&j, scratch);
}

static void attn_task(void *p, int ith, int nth) {
    attn_ctx *c = p;
    (void)nth;
    float *scratch = c->ws->attn_scratch + (int64_t)ith * c->ws->attn_floats;
    const int n_items = c->first[c->n_seq];
    int s = 0;
    for (;;) {
        const int idx = atomic_fetch_add_explicit(&c->next, 1, memory_order_relaxed);
        if (idx >= n_items) break;
        while (idx >= c->first[s + 1]) s++; /* idx only grows for one thread */
        attn_item(&c->seq[s], c->ws, idx - c->first[s], scratch);
    }
}

/* Combines the split-key partials of every (query block, kv head) of one sequence into att,
 * adding the heads' sink logits to the denominators. */
static void attn_merge(const attn_seq *c, ds4n_dec_ws *ws) {
    const ds4n_dec_dims *d = c->d;
    const int hd = d->head_dim, nkv = d->n_head_kv, G = d->n_head / nkv;
    const int64_t n_q = (int64_t)d->n_head * hd;
    const int64_t n_all = (int64_t)c->n_items;
    const int64_t stride = part_stride(c), rows = (int64_t)c->qblock * G;
    const float *pm = c->part + n_all * stride, *pl = pm + n_all * rows;
    for (int qb = 0; qb < c->n_qblocks; qb++) {
        const int64_t t0 = (int64_t)qb * c->qblock;
        const int n_tok = (int)(c->T - t0 < c->qblock ? c->T - t0 : c->qblock);
        for (int h = 0; h < nkv; h++) {
            const int64_t first = ((int64_t)(c->n_qblocks - 1 - qb) * nkv + h) * c->n_split;
            for (int r = 0; r < n_tok * G; r++) {
                float mx = -INFINITY;
                for (int sp = 0; sp < c->n_split; sp++) mx = fmaxf(mx, pm[(first + sp) * rows + r]);
                float *out = ws->att + (c->row0 + t0 + r / G) * n_q + (int64_t)(h * G + r % G) * hd;
                for (int dd = 0; dd < hd; dd++) out[dd] = 0.0f;
                float l = 0.0f;
                for (int sp = 0; sp < c->n_split; sp++) {
                    const float ms = pm[(first + sp) * rows + r];
                    if (ms == -INFINITY) continue;
                    const float w = expf(ms - mx);
                    const float *o = c->part + (first + sp) * stride + (int64_t)r * hd;
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

/* A sequence's plan depends only on its own rows, positions and the thread count, so it
 * is the same whether the sequence runs alone or in a batch. */
static void plan_attention(attn_seq *c, int nth) {
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
    c->n_items = c->n_qblocks * d->n_head_kv * c->n_split;
}

static const ds4n_rope *seq_rope(const ds4n_attn_layer *w, const ds4n_dec_session *s) {
    return w->rope_long && s->n_ctx > w->long_ctx ? w->rope_long : w->rope;
}

void ds4n_attention(const ds4n_dec_dims *d, const ds4n_attn_layer *w, int il,
                    const ds4n_dec_batch *b, ds4n_pool *pool, const float *xn, float *out) {
    const int hd = d->head_dim, E = d->n_embd;
    const int n_q = d->n_head * hd, n_kv = d->n_head_kv * hd;
    ds4n_dec_ws *ws = b->ws;
    proj_ctx pc = {.d = d, .w = w, .b = b, .ws = ws, .xn = xn};
    ds4n_dec_run(pool, qkv_task, &pc);
    for (int i = 0; i < b->n_seq; i++) {
        ds4n_dec_session *s = b->seq[i];
        const ds4n_rope *rope = seq_rope(w, s);
        const float *cs = rope ? ds4n_dec_ws_rope(b, rope) : NULL;
        for (int64_t r = b->row0[i]; r < b->row0[i] + b->count[i]; r++) {
            float *q = ws->q + r * n_q, *k = ws->kx + r * n_kv, *v = ws->vx + r * n_kv;
            if (w->wqkv) {
                const float *row = ws->qkv + r * (n_q + 2 * n_kv);
                memcpy(q, row, sizeof(float) * n_q);
                memcpy(k, row + n_q, sizeof(float) * n_kv);
                memcpy(v, row + n_q + n_kv, sizeof(float) * n_kv);
                if (w->bqkv) {
                    for (int j = 0; j < n_q; j++) q[j] += w->bqkv[j];
                    for (int j = 0; j < n_kv; j++) k[j] += w->bqkv[n_q + j];
                    for (int j = 0; j < n_kv; j++) v[j] += w->bqkv[n_q + n_kv + j];
                }
            }
            if (w->bq) for (int j = 0; j < n_q; j++) q[j] += w->bq[j];
            if (w->bk) for (int j = 0; j < n_kv; j++) k[j] += w->bk[j];
            if (w->bv) for (int j = 0; j < n_kv; j++) v[j] += w->bv[j];
            if (w->q_norm) ds4n_rms_norm(q, w->q_norm, q, d->n_head, hd, d->norm_eps);
            if (w->k_norm) ds4n_rms_norm(k, w->k_norm, k, d->n_head_kv, hd, d->norm_eps);
            if (rope) {
                ds4n_rope_apply(rope, q, cs + r * rope->n_rot, d->n_head, hd, w->q_scale);
                ds4n_rope_apply(rope, k, cs + r * rope->n_rot, d->n_head_kv, hd, 1.0f);
            } else {
                for (int j = 0; j < n_q; j++) q[j] *= w->q_scale;
            }
            ds4n_kv_store(&s->kv, il, b->pos0[i] + (r - b->row0[i]), k, v);
        }
    }
    const int nth = pool ? ds4n_pool_threads(pool) : 1;
    attn_seq seq[DS4N_DEC_MAX_SEQ];
    attn_ctx ac = {.ws = ws, .n_seq = b->n_seq, .seq = seq};
    int64_t part_used = 0;
    for (int i = 0; i < b->n_seq; i++) {
        attn_seq *c = &seq[i];
        *c = (attn_seq){.d = d, .w = w, .kv = &b->seq[i]->kv, .il = il, .T = b->count[i],
                        .pos0 = b->pos0[i], .row0 = b->row0[i], .bidir = b->bidir};
        plan_attention(c, nth);
        if (c->n_split > 1 && part_used + part_floats(c) > ws->cap_part) {
            c->n_split = 1; /* never reached by the plan's bound; correct, only slower */
            c->split_len = INT64_MAX;
            c->kstart = 0;
            c->n_items = c->n_qblocks * d->n_head_kv;
        }
        if (c->n_split > 1) {
            c->part = ws->part + part_used;
            part_used += part_floats(c);
        }
        ac.first[i + 1] = ac.first[i] + c->n_items;
    }
    atomic_store(&ac.next, 0);
    ds4n_dec_run(pool, attn_task, &ac);
    for (int i = 0; i < b->n_seq; i++)
        if (seq[i].n_split > 1) attn_merge(&seq[i], ws);
    ds4n_dec_project(pool, w->to, w->wo, E, n_q, ws->att, b->count, b->n_seq, out);
    if (w->bo)
        for (int64_t t = 0; t < b->n_rows; t++)
            for (int i = 0; i < E; i++) out[t * E + i] += w->bo[i];
}

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

ds4n_dec_session *ds4n_dec_session_new(const ds4n_dec_dims *d, int n_layer, int64_t n_ctx,
                                       int kv_type) {
    if (n_ctx <= 0 || d->n_embd <= 0) return NULL;
    ds4n_dec_session *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->dims = *d;
    s->n_ctx = n_ctx;
    if (ds4n_kv_init(&s->kv, n_layer, d->n_head_kv, d->head_dim, n_ctx, kv_type) != 0) {
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
int ds4n_dec_session_kv_type(const ds4n_dec_session *s) { return s->kv.type; }

int ds4n_dec_session_set_n_past(ds4n_dec_session *s, int64_t n) {
    if (n < 0 || n > s->n_ctx) return -1;
    s->n_past = n;
    return 0;
}

int ds4n_dec_session_kv_get(const ds4n_dec_session *s, int il, int which, int64_t start,
                            int64_t n, void *dst) {
    return ds4n_kv_get_rows(&s->kv, il, which, start, n, dst);
}

int ds4n_dec_session_kv_set(ds4n_dec_session *s, int il, int which, int64_t start,
                            int64_t n, const void *src) {
    return ds4n_kv_set_rows(&s->kv, il, which, start, n, src);
}

static int same_shape(const ds4n_dec_session *s, const ds4n_dec_dims *d, int n_layer) {
    const ds4n_dec_dims *e = &s->dims;
    return e->n_embd == d->n_embd && e->n_head == d->n_head && e->n_head_kv == d->n_head_kv &&
           e->head_dim == d->head_dim && e->n_ff == d->n_ff && e->norm_eps == d->norm_eps &&
           s->kv.n_layer == n_layer;
}

static int check_batch(const ds4n_dec_dims *d, int n_layer, ds4n_dec_session *const *seq,
                       int n_seq, const int64_t *count, int32_t n_vocab, const int32_t *tokens) {
    if (n_seq < 1 || n_seq > DS4N_DEC_MAX_SEQ || !seq || !count || !tokens) return DS4N_ERR_BAD_BATCH;
    for (int i = 0; i < n_seq; i++) {
        if (!seq[i] || count[i] < 1 || !same_shape(seq[i], d, n_layer)) return DS4N_ERR_BAD_BATCH;
        for (int j = 0; j < i; j++)
            if (seq[j] == seq[i]) return DS4N_ERR_BAD_BATCH;
    }
    for (int i = 0; i < n_seq; i++)
        if (count[i] > seq[i]->n_ctx - seq[i]->n_past) return DS4N_ERR_CONTEXT_FULL;
    const int32_t *tok = tokens;
    for (int i = 0; i < n_seq; i++)
        for (int64_t t = 0; t < count[i]; t++, tok++)
            if (*tok < 0 || *tok >= n_vocab) return DS4N_ERR_BAD_TOKEN;
    return DS4N_OK;
}

int ds4n_dec_batch_begin(ds4n_dec_batch *b, const ds4n_dec_dims *d, int n_layer,
                         ds4n_dec_session *const *seq, int n_seq, const int64_t *count,
                         ds4n_pool *pool, const void *embd, int32_t embd_type, int32_t n_vocab,
                         const int32_t *tokens, float embd_scale) {
    memset(b, 0, sizeof *b);
    const int rc = check_batch(d, n_layer, seq, n_seq, count, n_vocab, tokens);
    if (rc != DS4N_OK) return rc;
    b->n_seq = n_seq;
    b->seq = seq;
    b->count = count;
    for (int i = 0; i < n_seq; i++) {
        b->row0[i] = b->n_rows;
        b->pos0[i] = seq[i]->n_past;
        b->n_rows += count[i]; /* each count fits its n_ctx: no overflow */
    }
    const int E = d->n_embd;
    const int64_t T = b->n_rows;
    ds4n_dec_session *s = seq[0]; /* whose scratch serves the call */
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
    if (ds4n_dec_ws_reserve(&s->ws, &s->dims, T, n_seq, nth) != 0) return DS4N_ERR_NO_MEMORY;
    s->ws.call++;
    b->x = s->x;
    b->xn = s->xn;
    b->tmp = s->tmp;
    b->ws = &s->ws;
    const int64_t row_bytes = E / ds4n_type_block_size(embd_type) * ds4n_type_block_bytes(embd_type);
    for (int64_t t = 0; t < T; t++) {
        float *x = b->x + t * E;
        ds4n_dequantize(embd_type, (const char *)embd + tokens[t] * row_bytes, x, E);
        if (embd_scale != 1.0f)
            for (int i = 0; i < E; i++) x[i] *= embd_scale;
    }
    return DS4N_OK;
}

void ds4n_dec_batch_finish(ds4n_dec_batch *b, ds4n_pool *pool, const float *norm_w, float eps,
                           const void *head, int32_t head_type, int32_t n_vocab, float *logits,
                           int all_logits, float softcap) {
    const int E = b->seq[0]->dims.n_embd;
    for (int i = 0; i < b->n_seq; i++) b->seq[i]->n_past += b->count[i];
    if (!logits) return;
    int64_t rows;
    if (all_logits) {
        rows = b->n_rows;
        ds4n_rms_norm(b->x, norm_w, b->xn, rows, E, eps);
        ds4n_dec_project(pool, head_type, head, n_vocab, E, b->xn, b->count, b->n_seq, logits);
    } else {
        /* Each sequence's last row alone is a decode row, whatever its count. */
        rows = b->n_seq;
        for (int i = 0; i < b->n_seq; i++)
            ds4n_rms_norm(b->x + (b->row0[i] + b->count[i] - 1) * E, norm_w, b->xn + i * E, 1, E,
                          eps);
        int64_t ones[DS4N_DEC_MAX_SEQ];
        for (int i = 0; i < b->n_seq; i++) ones[i] = 1;
        ds4n_dec_project(pool, head_type, head, n_vocab, E, b->xn, ones, b->n_seq, logits);
    }
    if (softcap > 0.0f)
        for (int64_t i = 0; i < rows * n_vocab; i++)
            logits[i] = softcap * tanhf(logits[i] / softcap);
}
