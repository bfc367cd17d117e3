/* The llama-family forward pass (see llama.h). Per layer: RMSNorm, Q/K/V (one pool
 * dispatch), RoPE of llama.cpp's NORMAL type (adjacent pairs), K/V stored in the cache,
 * causal GQA attention (one dispatch), output projection, residual, RMSNorm, gate and up
 * (one dispatch), SwiGLU, down projection, residual. The small per-row ops (norms, RoPE,
 * residuals) run on the calling thread: they are a few microseconds next to the matmuls. */
#include "llama.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"

struct ds4n_llama {
    ds4n_llama_hparams hp;
    int n_q, n_kv;            /* widths of Q and of K/V: heads * head_dim */
    const void **w;           /* DS4N_LLAMA_N_GLOBAL + n_layer * DS4N_LLAMA_N_PER_LAYER */
    int32_t *type;
    float *inv_freq;          /* n_rot/2 angle rates, scaling and freq factors applied */
    int64_t embd_row_bytes;
};

struct ds4n_llama_session {
    const ds4n_llama *model;
    int64_t n_ctx, n_ctx_pad, n_past;
    float *k, *v;             /* [layer][kv head][n_ctx_pad positions] (layouts: attention.h) */
    /* scratch, grown on demand */
    int64_t cap_tok;
    float *x, *xn, *q, *kx, *vx, *att, *tmp, *gate, *up, *rope;
    int cap_threads;
    int64_t attn_floats;      /* per thread */
    float *attn_scratch;
    int64_t cap_part;
    float *part;              /* split-key partials: outputs, then m, then l */
};

static const void *weight(const ds4n_llama *m, int il, int slot) {
    return m->w[DS4N_LLAMA_N_GLOBAL + il * DS4N_LLAMA_N_PER_LAYER + slot];
}
static int wtype(const ds4n_llama *m, int il, int slot) {
    return m->type[DS4N_LLAMA_N_GLOBAL + il * DS4N_LLAMA_N_PER_LAYER + slot];
}

static void *alloc_floats(int64_t n) {
    size_t bytes = ((size_t)n * sizeof(float) + 63) / 64 * 64;
    return aligned_alloc(64, bytes ? bytes : 64);
}

/* ---- model ------------------------------------------------------------------------ */

ds4n_llama *ds4n_llama_new(const ds4n_llama_hparams *hp, const void *const *tensors,
                           const int32_t *types) {
    if (hp->n_layer <= 0 || hp->n_head <= 0 || hp->n_head_kv <= 0 ||
        hp->n_head % hp->n_head_kv != 0 || hp->head_dim <= 0 || hp->head_dim % 2 != 0 ||
        hp->n_rot <= 0 || hp->n_rot > hp->head_dim || hp->n_rot % 2 != 0 ||
        hp->n_vocab <= 0 || hp->n_embd <= 0 || hp->n_ff <= 0)
        return NULL;
    const int n_slots = DS4N_LLAMA_N_GLOBAL + hp->n_layer * DS4N_LLAMA_N_PER_LAYER;
    ds4n_llama *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->hp = *hp;
    m->n_q = hp->n_head * hp->head_dim;
    m->n_kv = hp->n_head_kv * hp->head_dim;
    m->w = malloc(sizeof(void *) * n_slots);
    m->type = malloc(sizeof(int32_t) * n_slots);
    m->inv_freq = malloc(sizeof(float) * (hp->n_rot / 2));
    if (!m->w || !m->type || !m->inv_freq) {
        ds4n_llama_free(m);
        return NULL;
    }
    memcpy(m->w, tensors, sizeof(void *) * n_slots);
    memcpy(m->type, types, sizeof(int32_t) * n_slots);
    const float *factors = m->w[DS4N_LLAMA_ROPE_FREQS];
    for (int i = 0; i < hp->n_rot / 2; i++) {
        double f = pow((double)hp->rope_base, -2.0 * i / hp->n_rot) * hp->rope_scale;
        if (factors) f /= factors[i];
        m->inv_freq[i] = (float)f;
    }
    const int et = m->type[DS4N_LLAMA_TOKEN_EMBD];
    m->embd_row_bytes = hp->n_embd / ds4n_type_block_size(et) * ds4n_type_block_bytes(et);
    return m;
}

void ds4n_llama_free(ds4n_llama *m) {
    if (!m) return;
    free(m->w);
    free(m->type);
    free(m->inv_freq);
    free(m);
}

/* ---- session ---------------------------------------------------------------------- */

static int64_t kv_floats_per_head(const ds4n_llama_session *s) {
    return s->n_ctx_pad * s->model->hp.head_dim;
}
static float *k_head(const ds4n_llama_session *s, int il, int h) {
    return s->k + ((int64_t)il * s->model->hp.n_head_kv + h) * kv_floats_per_head(s);
}
static float *v_head(const ds4n_llama_session *s, int il, int h) {
    return s->v + ((int64_t)il * s->model->hp.n_head_kv + h) * kv_floats_per_head(s);
}

ds4n_llama_session *ds4n_llama_session_new(const ds4n_llama *model, int64_t n_ctx) {
    if (n_ctx <= 0) return NULL;
    ds4n_llama_session *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->model = model;
    s->n_ctx = n_ctx;
    s->n_ctx_pad = (n_ctx + DS4N_KBLOCK - 1) / DS4N_KBLOCK * DS4N_KBLOCK;
    const int64_t n = (int64_t)model->hp.n_layer * model->hp.n_head_kv * kv_floats_per_head(s);
    /* calloc: untouched positions stay unbacked zero pages, so RSS follows use. */
    s->k = calloc((size_t)n, sizeof(float));
    s->v = calloc((size_t)n, sizeof(float));
    if (!s->k || !s->v) {
        ds4n_llama_session_free(s);
        return NULL;
    }
    return s;
}

static void free_scratch(ds4n_llama_session *s) {
    float **bufs[] = {&s->x, &s->xn, &s->q, &s->kx, &s->vx, &s->att,
                      &s->tmp, &s->gate, &s->up, &s->rope};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) {
        free(*bufs[i]);
        *bufs[i] = NULL;
    }
    s->cap_tok = 0;
}

void ds4n_llama_session_free(ds4n_llama_session *s) {
    if (!s) return;
    free_scratch(s);
    free(s->attn_scratch);
    free(s->part);
    free(s->k);
    free(s->v);
    free(s);
}

int64_t ds4n_llama_session_n_past(const ds4n_llama_session *s) { return s->n_past; }
int64_t ds4n_llama_session_n_ctx(const ds4n_llama_session *s) { return s->n_ctx; }

int64_t ds4n_llama_session_kv_bytes(const ds4n_llama_session *s) {
    return 2 * (int64_t)s->model->hp.n_layer * s->model->hp.n_head_kv *
           kv_floats_per_head(s) * (int64_t)sizeof(float);
}

int ds4n_llama_session_set_n_past(ds4n_llama_session *s, int64_t n) {
    if (n < 0 || n > s->n_ctx) return -1;
    s->n_past = n;
    return 0;
}

static int ensure_scratch(ds4n_llama_session *s, int64_t T, int n_threads, int64_t part_floats) {
    const ds4n_llama *m = s->model;
    const ds4n_llama_hparams *hp = &m->hp;
    if (T > s->cap_tok) {
        free_scratch(s);
        s->x = alloc_floats(T * hp->n_embd);
        s->xn = alloc_floats(T * hp->n_embd);
        s->q = alloc_floats(T * m->n_q);
        s->kx = alloc_floats(T * m->n_kv);
        s->vx = alloc_floats(T * m->n_kv);
        s->att = alloc_floats(T * m->n_q);
        s->tmp = alloc_floats(T * hp->n_embd);
        s->gate = alloc_floats(T * hp->n_ff);
        s->up = alloc_floats(T * hp->n_ff);
        s->rope = alloc_floats(T * hp->n_rot);
        if (!s->x || !s->xn || !s->q || !s->kx || !s->vx || !s->att || !s->tmp || !s->gate ||
            !s->up || !s->rope) {
            free_scratch(s);
            return -1;
        }
        s->cap_tok = T;
    }
    if (n_threads > s->cap_threads) {
        const int G = hp->n_head / hp->n_head_kv, max_rows = G > 48 ? G : 48;
        s->attn_floats = (ds4n_attn_scratch_floats(max_rows, hp->head_dim) + 15) / 16 * 16;
        free(s->attn_scratch);
        s->attn_scratch = alloc_floats(s->attn_floats * n_threads);
        s->cap_threads = s->attn_scratch ? n_threads : 0;
        if (!s->attn_scratch) return -1;
    }
    if (part_floats > s->cap_part) {
        free(s->part);
        s->part = alloc_floats(part_floats);
        s->cap_part = s->part ? part_floats : 0;
        if (!s->part) return -1;
    }
    return 0;
}

/* ---- the per-layer steps ------------------------------------------------------------ */

static void run(ds4n_pool *pool, void (*fn)(void *, int, int), void *ctx) {
    if (pool)
        ds4n_pool_run(pool, fn, ctx);
    else
        fn(ctx, 0, 1);
}

static void rms_norm(const float *x, const float *w, float *out, int64_t T, int n, float eps) {
    for (int64_t t = 0; t < T; t++) {
        const float *xr = x + t * n;
        float *o = out + t * n;
        double ss = 0.0;
        for (int i = 0; i < n; i++) ss += (double)xr[i] * xr[i];
        const float scale = (float)(1.0 / sqrt(ss / n + eps));
        for (int i = 0; i < n; i++) o[i] = xr[i] * scale * w[i];
    }
}

static void add_rows(float *x, const float *y, const float *bias, int64_t T, int n) {
    for (int64_t t = 0; t < T; t++)
        for (int i = 0; i < n; i++) x[t * n + i] += y[t * n + i] + (bias ? bias[i] : 0.0f);
}

/* Rotates adjacent pairs (x[2i], x[2i+1]) of each head's first n_rot values. */
static void rope_rows(float *x, const float *cs, int n_heads, int hd, int n_rot, float scale) {
    for (int h = 0; h < n_heads; h++) {
        float *xh = x + (int64_t)h * hd;
        for (int i = 0; i < n_rot / 2; i++) {
            const float c = cs[2 * i], sn = cs[2 * i + 1];
            const float a = xh[2 * i], b = xh[2 * i + 1];
            xh[2 * i] = (a * c - b * sn) * scale;
            xh[2 * i + 1] = (a * sn + b * c) * scale;
        }
        for (int i = n_rot; i < hd; i++) xh[i] *= scale;
    }
}

typedef struct {
    const ds4n_llama *m;
    ds4n_llama_session *s;
    int il;
    int64_t T;
} layer_ctx;

static void qkv_task(void *p, int ith, int nth) {
    const layer_ctx *c = p;
    const ds4n_llama *m = c->m;
    const int E = m->hp.n_embd;
    ds4n_matmul_part(wtype(m, c->il, DS4N_LLAMA_WQ), weight(m, c->il, DS4N_LLAMA_WQ), m->n_q, E,
                     c->s->xn, c->T, c->s->q, ith, nth);
    ds4n_matmul_part(wtype(m, c->il, DS4N_LLAMA_WK), weight(m, c->il, DS4N_LLAMA_WK), m->n_kv, E,
                     c->s->xn, c->T, c->s->kx, ith, nth);
    ds4n_matmul_part(wtype(m, c->il, DS4N_LLAMA_WV), weight(m, c->il, DS4N_LLAMA_WV), m->n_kv, E,
                     c->s->xn, c->T, c->s->vx, ith, nth);
}

static void gate_up_task(void *p, int ith, int nth) {
    const layer_ctx *c = p;
    const ds4n_llama *m = c->m;
    const int E = m->hp.n_embd, F = m->hp.n_ff;
    ds4n_matmul_part(wtype(m, c->il, DS4N_LLAMA_W_GATE), weight(m, c->il, DS4N_LLAMA_W_GATE), F, E,
                     c->s->xn, c->T, c->s->gate, ith, nth);
    ds4n_matmul_part(wtype(m, c->il, DS4N_LLAMA_W_UP), weight(m, c->il, DS4N_LLAMA_W_UP), F, E,
                     c->s->xn, c->T, c->s->up, ith, nth);
}

typedef struct {
    float *g;
    const float *u;
    int64_t n;
} swiglu_ctx;

static void swiglu_task(void *p, int ith, int nth) {
    const swiglu_ctx *c = p;
    const int64_t per = (c->n / nth + 7) / 8 * 8;
    const int64_t a = per * ith, b = a + per < c->n ? a + per : c->n;
    if (a < b) ds4n_swiglu(c->g + a, c->u + a, b - a);
}

/* Attention work: items (query block, kv head, key split), most expensive first, taken
 * from a shared counter so uneven causal blocks balance across threads. */
typedef struct {
    const ds4n_llama *m;
    ds4n_llama_session *s;
    int il;
    int64_t T, pos0;
    int qblock, n_qblocks, n_split;
    int64_t split_len;
    atomic_int next;
} attn_ctx;

static int64_t part_stride(const attn_ctx *c) {
    return (int64_t)c->qblock * (c->m->hp.n_head / c->m->hp.n_head_kv) * c->m->hp.head_dim;
}

static void attn_task(void *p, int ith, int nth) {
    attn_ctx *c = p;
    const ds4n_llama *m = c->m;
    ds4n_llama_session *s = c->s;
    const int hd = m->hp.head_dim, nkv = m->hp.n_head_kv, G = m->hp.n_head / nkv;
    const int n_items = c->n_qblocks * nkv * c->n_split;
    float *scratch = s->attn_scratch + (int64_t)ith * s->attn_floats;
    for (;;) {
        const int idx = atomic_fetch_add_explicit(&c->next, 1, memory_order_relaxed);
        if (idx >= n_items) break;
        const int qb = c->n_qblocks - 1 - idx / (nkv * c->n_split);
        const int h = idx % (nkv * c->n_split) / c->n_split, sp = idx % c->n_split;
        const int64_t t0 = (int64_t)qb * c->qblock;
        ds4n_attn_job j = {
            .q = s->q + t0 * m->n_q + (int64_t)h * G * hd, .q_stride = m->n_q,
            .o = s->att + t0 * m->n_q + (int64_t)h * G * hd, .o_stride = m->n_q,
            .n_tok = (int)(c->T - t0 < c->qblock ? c->T - t0 : c->qblock),
            .n_group = G, .head_dim = hd, .pos0 = c->pos0 + t0,
            .k = k_head(s, c->il, h), .v = v_head(s, c->il, h),
            .k0 = 0, .k1 = INT64_MAX,
        };
        if (c->n_split > 1) {
            const int64_t stride = part_stride(c), rows = (int64_t)c->qblock * G;
            const int64_t n_all = (int64_t)n_items;
            j.k0 = sp * c->split_len;
            j.k1 = j.k0 + c->split_len;
            j.o = s->part + idx * stride;
            j.o_stride = (int64_t)G * hd;
            j.m = s->part + n_all * stride + idx * rows;
            j.l = s->part + n_all * stride + n_all * rows + idx * rows;
        }
        ds4n_attn_run(&j, scratch);
    }
}

/* Combines the split-key partials of every (query block, kv head) into att. */
static void attn_merge(const attn_ctx *c) {
    const ds4n_llama *m = c->m;
    ds4n_llama_session *s = c->s;
    const int hd = m->hp.head_dim, nkv = m->hp.n_head_kv, G = m->hp.n_head / nkv;
    const int64_t n_all = (int64_t)c->n_qblocks * nkv * c->n_split;
    const int64_t stride = part_stride(c), rows = (int64_t)c->qblock * G;
    const float *pm = s->part + n_all * stride, *pl = pm + n_all * rows;
    for (int qb = 0; qb < c->n_qblocks; qb++) {
        const int64_t t0 = (int64_t)qb * c->qblock;
        const int n_tok = (int)(c->T - t0 < c->qblock ? c->T - t0 : c->qblock);
        for (int h = 0; h < nkv; h++) {
            const int64_t first = ((int64_t)(c->n_qblocks - 1 - qb) * nkv + h) * c->n_split;
            for (int r = 0; r < n_tok * G; r++) {
                float mx = -INFINITY;
                for (int sp = 0; sp < c->n_split; sp++) mx = fmaxf(mx, pm[(first + sp) * rows + r]);
                float *out = s->att + (t0 + r / G) * m->n_q + (int64_t)(h * G + r % G) * hd;
                for (int d = 0; d < hd; d++) out[d] = 0.0f;
                float l = 0.0f;
                for (int sp = 0; sp < c->n_split; sp++) {
                    const float ms = pm[(first + sp) * rows + r];
                    if (ms == -INFINITY) continue;
                    const float w = expf(ms - mx);
                    const float *o = s->part + (first + sp) * stride + (int64_t)r * hd;
                    l += w * pl[(first + sp) * rows + r];
                    for (int d = 0; d < hd; d++) out[d] += w * o[d];
                }
                const float inv = l > 0.0f ? 1.0f / l : 0.0f;
                for (int d = 0; d < hd; d++) out[d] *= inv;
            }
        }
    }
}

static void plan_attention(attn_ctx *c, int nth) {
    const ds4n_llama_hparams *hp = &c->m->hp;
    const int G = hp->n_head / hp->n_head_kv;
    /* ~48 query rows per job: enough reuse of each K/V load, small enough to balance. */
    c->qblock = 48 / G > 0 ? 48 / G : 1;
    c->n_qblocks = (int)((c->T + c->qblock - 1) / c->qblock);
    c->n_split = 1;
    c->split_len = INT64_MAX;
    const int64_t n_keys = c->pos0 + c->T;
    const int base = c->n_qblocks * hp->n_head_kv;
    if (base < 4 * nth && n_keys >= 4 * DS4N_KBLOCK) {
        /* Few query rows (decode): split the keys too, and merge the partial softmaxes. */
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

/* ---- eval ----------------------------------------------------------------------------- */

int ds4n_llama_eval(const ds4n_llama *m, ds4n_llama_session *s, ds4n_pool *pool,
                    const int32_t *tokens, int64_t T, float *logits, int all_logits) {
    const ds4n_llama_hparams *hp = &m->hp;
    if (T <= 0) return DS4N_OK;
    if (s->n_past + T > s->n_ctx) return DS4N_ERR_CONTEXT_FULL;
    for (int64_t t = 0; t < T; t++)
        if (tokens[t] < 0 || tokens[t] >= hp->n_vocab) return DS4N_ERR_BAD_TOKEN;
    const int nth = pool ? ds4n_pool_threads(pool) : 1;
    attn_ctx ac = {.m = m, .s = s, .T = T, .pos0 = s->n_past};
    plan_attention(&ac, nth);
    const int G = hp->n_head / hp->n_head_kv;
    const int64_t n_items = (int64_t)ac.n_qblocks * hp->n_head_kv * ac.n_split;
    const int64_t part_floats =
        ac.n_split > 1 ? n_items * ((int64_t)ac.qblock * G * (hp->head_dim + 2)) : 0;
    if (ensure_scratch(s, T, nth, part_floats) != 0) return DS4N_ERR_NO_MEMORY;

    const int E = hp->n_embd, hd = hp->head_dim, half = hp->n_rot / 2;
    const char *embd = m->w[DS4N_LLAMA_TOKEN_EMBD];
    for (int64_t t = 0; t < T; t++)
        ds4n_dequantize(m->type[DS4N_LLAMA_TOKEN_EMBD], embd + tokens[t] * m->embd_row_bytes,
                        s->x + t * E, E);
    /* cos/sin per position, angles in double: positions reach 10^5 radians and beyond. */
    for (int64_t t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            const double a = (double)(s->n_past + t) * m->inv_freq[i];
            s->rope[t * hp->n_rot + 2 * i] = (float)cos(a);
            s->rope[t * hp->n_rot + 2 * i + 1] = (float)sin(a);
        }
    const float q_scale = 1.0f / sqrtf((float)hd);

    for (int il = 0; il < hp->n_layer; il++) {
        layer_ctx lc = {.m = m, .s = s, .il = il, .T = T};
        rms_norm(s->x, weight(m, il, DS4N_LLAMA_ATTN_NORM), s->xn, T, E, hp->rms_eps);
        run(pool, qkv_task, &lc);
        const float *bq = weight(m, il, DS4N_LLAMA_BQ), *bk = weight(m, il, DS4N_LLAMA_BK),
                    *bv = weight(m, il, DS4N_LLAMA_BV);
        for (int64_t t = 0; t < T; t++) {
            float *q = s->q + t * m->n_q, *k = s->kx + t * m->n_kv, *v = s->vx + t * m->n_kv;
            if (bq) for (int i = 0; i < m->n_q; i++) q[i] += bq[i];
            if (bk) for (int i = 0; i < m->n_kv; i++) k[i] += bk[i];
            if (bv) for (int i = 0; i < m->n_kv; i++) v[i] += bv[i];
            rope_rows(q, s->rope + t * hp->n_rot, hp->n_head, hd, hp->n_rot, q_scale);
            rope_rows(k, s->rope + t * hp->n_rot, hp->n_head_kv, hd, hp->n_rot, 1.0f);
            const int64_t pos = s->n_past + t;
            for (int h = 0; h < hp->n_head_kv; h++) {
                float *kt = k_head(s, il, h) + (pos / DS4N_KT) * hd * DS4N_KT + pos % DS4N_KT;
                for (int d = 0; d < hd; d++) kt[(int64_t)d * DS4N_KT] = k[h * hd + d];
                memcpy(v_head(s, il, h) + pos * hd, v + h * hd, sizeof(float) * hd);
            }
        }
        ac.il = il;
        atomic_store(&ac.next, 0);
        run(pool, attn_task, &ac);
        if (ac.n_split > 1) attn_merge(&ac);
        ds4n_matmul(pool, wtype(m, il, DS4N_LLAMA_WO), weight(m, il, DS4N_LLAMA_WO), E, m->n_q,
                    s->att, T, s->tmp);
        add_rows(s->x, s->tmp, weight(m, il, DS4N_LLAMA_BO), T, E);

        rms_norm(s->x, weight(m, il, DS4N_LLAMA_FFN_NORM), s->xn, T, E, hp->rms_eps);
        run(pool, gate_up_task, &lc);
        swiglu_ctx sc = {.g = s->gate, .u = s->up, .n = T * hp->n_ff};
        if (T == 1)
            swiglu_task(&sc, 0, 1);
        else
            run(pool, swiglu_task, &sc);
        ds4n_matmul(pool, wtype(m, il, DS4N_LLAMA_W_DOWN), weight(m, il, DS4N_LLAMA_W_DOWN), E,
                    hp->n_ff, s->gate, T, s->tmp);
        add_rows(s->x, s->tmp, NULL, T, E);
    }
    s->n_past += T;

    if (logits) {
        const int64_t first = all_logits ? 0 : T - 1, rows = T - first;
        rms_norm(s->x + first * E, m->w[DS4N_LLAMA_OUTPUT_NORM], s->xn, rows, E, hp->rms_eps);
        const int head = m->w[DS4N_LLAMA_OUTPUT] ? DS4N_LLAMA_OUTPUT : DS4N_LLAMA_TOKEN_EMBD;
        ds4n_matmul(pool, m->type[head], m->w[head], hp->n_vocab, E, s->xn, rows, logits);
    }
    return DS4N_OK;
}

/* ---- KV rows for save/load ------------------------------------------------------------ */

/* Offset of (position p, dim d) in a head's K tiles. */
static int64_t k_index(int64_t p, int d, int hd) {
    return (p / DS4N_KT) * hd * DS4N_KT + (int64_t)d * DS4N_KT + p % DS4N_KT;
}

int ds4n_llama_kv_get(const ds4n_llama_session *s, int il, int which, int64_t n, float *dst) {
    const int hd = s->model->hp.head_dim;
    if (il < 0 || il >= s->model->hp.n_layer || n < 0 || n > s->n_ctx) return -1;
    for (int h = 0; h < s->model->hp.n_head_kv; h++) {
        float *out = dst + (int64_t)h * n * hd;
        if (which == 1) {
            memcpy(out, v_head(s, il, h), sizeof(float) * n * hd);
            continue;
        }
        const float *k = k_head(s, il, h);
        for (int64_t p = 0; p < n; p++)
            for (int d = 0; d < hd; d++)
                out[p * hd + d] = k[k_index(p, d, hd)];
    }
    return 0;
}

int ds4n_llama_kv_set(ds4n_llama_session *s, int il, int which, int64_t n, const float *src) {
    const int hd = s->model->hp.head_dim;
    if (il < 0 || il >= s->model->hp.n_layer || n < 0 || n > s->n_ctx) return -1;
    for (int h = 0; h < s->model->hp.n_head_kv; h++) {
        const float *in = src + (int64_t)h * n * hd;
        if (which == 1) {
            memcpy(v_head(s, il, h), in, sizeof(float) * n * hd);
            continue;
        }
        float *k = k_head(s, il, h);
        for (int64_t p = 0; p < n; p++)
            for (int d = 0; d < hd; d++)
                k[k_index(p, d, hd)] = in[p * hd + d];
    }
    return 0;
}
