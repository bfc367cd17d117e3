/* The attention block of the decoder families (see decoder.h): projections, RoPE and the
 * K/V store around attention.c's kernels, planned and dispatched on the pool. */
#include "decoder.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "decoder_internal.h"

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
    int first[DS4N_DEC_MAX_UNITS + 1]; /* first item of each unit */
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

/* Whether a unit planned over several rows splits its keys as each of its rows planned
 * alone (a decode step of that row) does: then every row is computed as that step
 * computes it. */
static int same_plan_per_row(const attn_seq *c, int nth) {
    for (int64_t t = 0; t < c->T; t++) {
        attn_seq r = *c;
        r.T = 1;
        r.pos0 = c->pos0 + t;
        r.row0 = c->row0 + t;
        plan_attention(&r, nth);
        if (r.n_split != c->n_split) return 0;
        if (c->n_split > 1 && (r.split_len != c->split_len || r.kstart != c->kstart)) return 0;
    }
    return 1;
}

static const ds4n_rope *seq_rope(const ds4n_attn_layer *w, const ds4n_dec_session *s) {
    return w->rope_long && s->n_ctx > w->long_ctx ? w->rope_long : w->rope;
}

/* The per-row steps between the projections and attention: biases, QK norms, RoPE and the
 * K/V store, for rows [a, e) of the batch. */
typedef struct {
    const ds4n_dec_dims *d;
    const ds4n_attn_layer *w;
    int il;
    const ds4n_dec_batch *b;
    const ds4n_rope *rope[DS4N_DEC_MAX_SEQ];
    const float *cs[DS4N_DEC_MAX_SEQ]; /* each sequence's RoPE table (ds4n_dec_ws_rope) */
} prep_ctx;

static void prep_rows(const prep_ctx *c, int64_t a, int64_t e) {
    const ds4n_dec_dims *d = c->d;
    const ds4n_attn_layer *w = c->w;
    const ds4n_dec_batch *b = c->b;
    ds4n_dec_ws *ws = b->ws;
    const int il = c->il, hd = d->head_dim;
    const int n_q = d->n_head * hd, n_kv = d->n_head_kv * hd;
    for (int i = 0; i < b->n_seq; i++) {
        ds4n_dec_session *s = b->seq[i];
        const ds4n_rope *rope = c->rope[i];
        const float *cs = c->cs[i];
        const int64_t r0 = b->row0[i] > a ? b->row0[i] : a;
        const int64_t r1 = b->row0[i] + b->count[i] < e ? b->row0[i] + b->count[i] : e;
        for (int64_t r = r0; r < r1; r++) {
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
}

static void prep_task(void *p, int ith, int nth) {
    const prep_ctx *c = p;
    const int64_t n = c->b->n_rows;
    prep_rows(c, n * ith / nth, n * (ith + 1) / nth);
}

void ds4n_attention(const ds4n_dec_dims *d, const ds4n_attn_layer *w, int il,
                    const ds4n_dec_batch *b, ds4n_pool *pool, const float *xn, float *out) {
    const int hd = d->head_dim, E = d->n_embd;
    const int n_q = d->n_head * hd;
    ds4n_dec_ws *ws = b->ws;
    proj_ctx pc = {.d = d, .w = w, .b = b, .ws = ws, .xn = xn};
    ds4n_dec_run(pool, qkv_task, &pc);
    prep_ctx rc = {.d = d, .w = w, .il = il, .b = b};
    /* A prefill chunk's rows on the pool (each row's steps are its own, so any split gives
     * the same bytes); a few decode rows are not worth a dispatch. Several sequences go one
     * after the other, each table fetched just before its rows: the workspace holds only
     * DS4N_WS_ROPES tables, and a later sequence's may take an earlier one's slot. */
    for (int i = 0; i < b->n_seq; i++) {
        rc.rope[i] = seq_rope(w, b->seq[i]);
        rc.cs[i] = rc.rope[i] ? ds4n_dec_ws_rope(b, rc.rope[i]) : NULL;
        if (pool && b->n_seq == 1 && b->n_rows > DS4N_DEC_SMALL_T)
            ds4n_pool_run(pool, prep_task, &rc);
        else
            prep_rows(&rc, b->row0[i], b->row0[i] + b->count[i]);
    }
    const int nth = pool ? ds4n_pool_threads(pool) : 1;
    /* Units of attention work: a sequence, or, for a sequence of decode rows (at most
     * DS4N_DEC_SMALL_T: a verification chunk of speculative decoding) whose key splits would
     * differ from those of its rows' own decode steps (its last key crosses a split
     * boundary its first does not), each row as a unit of its own, planned as its decode
     * step is: every row of it is then bitwise that step's (the chunk shares the reads of
     * K and V between its rows otherwise). */
    attn_seq seq[DS4N_DEC_MAX_UNITS];
    int n_units = 0;
    for (int i = 0; i < b->n_seq; i++) {
        attn_seq c = {.d = d, .w = w, .kv = &b->seq[i]->kv, .il = il, .T = b->count[i],
                      .pos0 = b->pos0[i], .row0 = b->row0[i], .bidir = b->bidir};
        plan_attention(&c, nth);
        if (c.T == 1 || c.T > DS4N_DEC_SMALL_T || c.bidir || same_plan_per_row(&c, nth)) {
            seq[n_units++] = c;
            continue;
        }
        for (int64_t t = 0; t < c.T; t++) {
            attn_seq *r = &seq[n_units++];
            *r = c;
            r->T = 1;
            r->pos0 = c.pos0 + t;
            r->row0 = c.row0 + t;
            plan_attention(r, nth);
        }
    }
    attn_ctx ac = {.ws = ws, .n_seq = n_units, .seq = seq};
    int64_t part_used = 0;
    for (int i = 0; i < n_units; i++) {
        attn_seq *c = &seq[i];
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
    for (int i = 0; i < n_units; i++)
        if (seq[i].n_split > 1) attn_merge(&seq[i], ws);
    ds4n_dec_project(pool, w->to, w->wo, E, n_q, ws->att, b->count, b->n_seq, out);
    if (w->bo)
        for (int64_t t = 0; t < b->n_rows; t++)
            for (int i = 0; i < E; i++) out[t * E + i] += w->bo[i];
}
