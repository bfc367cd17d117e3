/* Sessions, batches over several sessions, and the workspace a batch runs in (see
 * decoder.h). */
#include "decoder.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "decoder_internal.h"

static void *alloc_floats(int64_t n) {
    size_t bytes = ((size_t)n * sizeof(float) + 63) / 64 * 64;
    return aligned_alloc(64, bytes ? bytes : 64);
}

/* ---- workspace ---------------------------------------------------------------------- */

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

int ds4n_dec_ws_reserve(ds4n_dec_ws *ws, const ds4n_dec_dims *d, int64_t T, int n_units,
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
    const int64_t part_floats = (int64_t)n_units * MAX_SPLIT_ITEMS_PER_THREAD * nth *
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
    /* Attention units (decoder_attention.c): a sequence of decode rows may run as one unit
     * per row, a longer one is one unit. */
    int units = 0;
    for (int i = 0; i < n_seq; i++) units += count[i] <= DS4N_DEC_SMALL_T ? (int)count[i] : 1;
    if (ds4n_dec_ws_reserve(&s->ws, &s->dims, T, units, nth) != 0) return DS4N_ERR_NO_MEMORY;
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
                           const int64_t *n_logits, float softcap) {
    const int E = b->seq[0]->dims.n_embd;
    for (int i = 0; i < b->n_seq; i++) b->seq[i]->n_past += b->count[i];
    if (!logits) return;
    /* Each sequence's last n_logits[i] rows (its last row alone without n_logits), gathered
     * in order into xn: a sequence of at most DS4N_DEC_SMALL_T of them gets decode rows
     * (bitwise the single-token product), a longer one the call it makes alone. */
    int64_t want[DS4N_DEC_MAX_SEQ] = {0};
    int64_t rows = 0;
    for (int i = 0; i < b->n_seq; i++) {
        want[i] = n_logits ? n_logits[i] : 1;
        ds4n_rms_norm(b->x + (b->row0[i] + b->count[i] - want[i]) * E, norm_w, b->xn + rows * E,
                      want[i], E, eps);
        rows += want[i];
    }
    ds4n_dec_project(pool, head_type, head, n_vocab, E, b->xn, want, b->n_seq, logits);
    if (softcap > 0.0f)
        for (int64_t i = 0; i < rows * n_vocab; i++)
            logits[i] = softcap * tanhf(logits[i] / softcap);
}
