/* The MoE decoder families' session (see moe_session.h). */
#include "moe_session.h"

#include <stdlib.h>

static void *alloc_floats(int64_t n) {
    size_t bytes = ((size_t)n * sizeof(float) + 63) / 64 * 64;
    return aligned_alloc(64, bytes ? bytes : 64);
}

ds4n_moe_session *ds4n_moe_session_new(const ds4n_dec_dims *dims, int n_layer, int64_t n_ctx) {
    if (n_ctx <= 0) return NULL;
    ds4n_moe_session *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->dims = *dims;
    s->dims.n_ff = 0;
    s->n_ctx = n_ctx;
    s->moe = ds4n_moe_scratch_new();
    if (!s->moe || ds4n_kv_init(&s->kv, n_layer, dims->n_head_kv, dims->head_dim, n_ctx) != 0) {
        ds4n_moe_session_free(s);
        return NULL;
    }
    return s;
}

static void free_rows(ds4n_moe_session *s) {
    free(s->x);
    free(s->xn);
    free(s->tmp);
    s->x = s->xn = s->tmp = NULL;
    s->cap_tok = 0;
}

void ds4n_moe_session_free(ds4n_moe_session *s) {
    if (!s) return;
    free_rows(s);
    ds4n_dec_ws_release(&s->ws);
    ds4n_kv_release(&s->kv);
    ds4n_moe_scratch_free(s->moe);
    free(s);
}

int64_t ds4n_moe_session_n_past(const ds4n_moe_session *s) { return s->n_past; }
int64_t ds4n_moe_session_n_ctx(const ds4n_moe_session *s) { return s->n_ctx; }
int64_t ds4n_moe_session_kv_bytes(const ds4n_moe_session *s) { return ds4n_kv_bytes(&s->kv); }
int64_t ds4n_moe_session_expert_bytes(const ds4n_moe_session *s) {
    return ds4n_moe_expert_bytes(s->moe);
}

int ds4n_moe_session_set_n_past(ds4n_moe_session *s, int64_t n) {
    if (n < 0 || n > s->n_ctx) return -1;
    s->n_past = n;
    return 0;
}

int ds4n_moe_session_kv_get(const ds4n_moe_session *s, int layer, int which, int64_t n,
                            float *dst) {
    return ds4n_kv_get(&s->kv, layer, which, n, dst);
}

int ds4n_moe_session_kv_set(ds4n_moe_session *s, int layer, int which, int64_t n,
                            const float *src) {
    return ds4n_kv_set(&s->kv, layer, which, n, src);
}

int ds4n_moe_session_prepare(ds4n_moe_session *s, const int32_t *tokens, int64_t T,
                             int32_t n_vocab, int nth, const ds4n_moe *moe) {
    if (T > s->n_ctx - s->n_past) return DS4N_MOE_SESS_CONTEXT_FULL;
    for (int64_t t = 0; t < T; t++)
        if (tokens[t] < 0 || tokens[t] >= n_vocab) return DS4N_MOE_SESS_BAD_TOKEN;
    if (ds4n_dec_ws_reserve(&s->ws, &s->dims, T, nth) != 0 ||
        ds4n_moe_scratch_reserve(s->moe, moe, T) != 0)
        return DS4N_MOE_SESS_NO_MEMORY;
    if (T > s->cap_tok) {
        free_rows(s);
        const int64_t n = T * s->dims.n_embd;
        s->x = alloc_floats(n);
        s->xn = alloc_floats(n);
        s->tmp = alloc_floats(n);
        if (!s->x || !s->xn || !s->tmp) {
            free_rows(s);
            return DS4N_MOE_SESS_NO_MEMORY;
        }
        s->cap_tok = T;
    }
    return DS4N_MOE_SESS_OK;
}

void ds4n_moe_session_embed(ds4n_moe_session *s, int type, const void *table,
                            const int32_t *tokens, int64_t T) {
    const int64_t E = s->dims.n_embd;
    const int64_t row = E / ds4n_type_block_size(type) * ds4n_type_block_bytes(type);
    for (int64_t t = 0; t < T; t++)
        ds4n_dequantize(type, (const char *)table + tokens[t] * row, s->x + t * E, E);
}

void ds4n_moe_session_logits(ds4n_moe_session *s, ds4n_pool *pool, int64_t T,
                             const float *norm, float eps, int head_type, const void *head,
                             int32_t n_vocab, float *logits, int all_logits) {
    if (!logits) return;
    const int E = s->dims.n_embd;
    const int64_t first = all_logits ? 0 : T - 1, rows = T - first;
    ds4n_rms_norm(s->x + first * E, norm, s->xn, rows, E, eps);
    ds4n_matmul(pool, head_type, head, n_vocab, E, s->xn, rows, logits);
}

int ds4n_moe_session_status(int moe_rc) {
    return moe_rc == DS4N_MOE_ERR_BAD_EXPERT ? DS4N_MOE_SESS_BAD_EXPERT : DS4N_MOE_SESS_NO_MEMORY;
}
