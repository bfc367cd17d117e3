/* The shared part of every attention-decoder family's model (see decoder_model.h). */
#include "decoder_model.h"

#include <stdlib.h>
#include <string.h>

static int shape_ok(const ds4n_dec_shape *s) {
    return s->n_vocab > 0 && s->n_embd > 0 && s->n_layer > 0 && s->n_head > 0 &&
           s->n_head_kv > 0 && s->n_head % s->n_head_kv == 0 && s->head_dim > 0 &&
           s->n_ff >= 0 && s->n_rot > 0 && s->n_rot <= s->head_dim;
}

void *ds4n_dec_model_new(size_t size, const ds4n_dec_shape *shape, int n_global,
                         int n_per_layer, const void *const *tensors, const int32_t *types,
                         ds4n_dec_layers_fn layers) {
    if (size < sizeof(ds4n_dec_model) || !shape_ok(shape) || n_global < DS4N_DEC_N_GLOBAL)
        return NULL;
    ds4n_dec_model *m = calloc(1, size);
    if (!m) return NULL;
    m->shape = *shape;
    m->dims = (ds4n_dec_dims){.n_embd = shape->n_embd, .n_head = shape->n_head,
                              .n_head_kv = shape->n_head_kv, .head_dim = shape->head_dim,
                              .n_ff = shape->n_ff, .norm_eps = shape->rms_eps};
    m->embd_scale = 1.0f;
    m->softcap = 0.0f;
    m->layers = layers;
    if (ds4n_dec_weights_init(&m->wt, n_global, n_per_layer, shape->n_layer, tensors, types)) {
        ds4n_dec_model_free(m);
        return NULL;
    }
    return m;
}

ds4n_rope_params ds4n_dec_rope_params(const ds4n_dec_shape *shape, int mode,
                                      const ds4n_dec_rope_scaling *scaling,
                                      const float *freq_factors) {
    ds4n_rope_params p = {.n_rot = shape->n_rot, .mode = mode, .base = shape->rope_base,
                          .freq_scale = 1.0f, .freq_factors = freq_factors};
    if (scaling) {
        p.freq_scale = scaling->freq_scale;
        p.ext_factor = scaling->ext_factor;
        p.attn_factor = scaling->attn_factor;
        p.beta_fast = scaling->beta_fast;
        p.beta_slow = scaling->beta_slow;
        p.n_ctx_orig = scaling->n_ctx_orig;
    }
    return p;
}

void ds4n_dec_model_free(ds4n_dec_model *m) {
    if (!m) return;
    if (m->release) m->release(m);
    ds4n_dec_weights_free(&m->wt);
    free(m); /* the first member of ds4n_dec_model_new's allocation */
}

ds4n_dec_session *ds4n_dec_model_session_new(const ds4n_dec_model *m, int64_t n_ctx,
                                             int kv_type) {
    return ds4n_dec_session_new(&m->dims, m->shape.n_layer, n_ctx, kv_type);
}

static int eval(const ds4n_dec_model *m, ds4n_pool *pool, ds4n_dec_session *const *sessions,
                const int32_t *tokens, const int64_t *counts, int n_seq, float *logits,
                const int64_t *n_logits) {
    const ds4n_dec_shape *s = &m->shape;
    const ds4n_dec_weights *wt = &m->wt;
    ds4n_dec_batch b;
    int rc = ds4n_dec_batch_begin(&b, &m->dims, s->n_layer, sessions, n_seq, counts, pool,
                                  wt->w[DS4N_DEC_TOKEN_EMBD], wt->type[DS4N_DEC_TOKEN_EMBD],
                                  s->n_vocab, tokens, m->embd_scale);
    b.bidir = m->bidirectional;
    if (rc == DS4N_OK) rc = m->layers(m, &b, pool);
    if (rc != DS4N_OK) return rc;
    const int head = wt->w[DS4N_DEC_OUTPUT] ? DS4N_DEC_OUTPUT : DS4N_DEC_TOKEN_EMBD;
    ds4n_dec_batch_finish(&b, pool, wt->w[DS4N_DEC_OUTPUT_NORM], s->rms_eps, wt->w[head],
                          wt->type[head], s->n_vocab, logits, n_logits, m->softcap);
    return DS4N_OK;
}

int ds4n_dec_model_eval(const ds4n_dec_model *m, ds4n_dec_session *s, ds4n_pool *pool,
                        const int32_t *tokens, int64_t T, float *logits, int all_logits) {
    if (T <= 0) return DS4N_OK;
    return eval(m, pool, &s, tokens, &T, 1, logits, all_logits ? &T : NULL);
}

int ds4n_dec_model_eval_batch(const ds4n_dec_model *m, ds4n_pool *pool,
                              ds4n_dec_session *const *sessions, const int32_t *tokens,
                              const int64_t *counts, int n_seq, float *logits) {
    return eval(m, pool, sessions, tokens, counts, n_seq, logits, NULL);
}

int ds4n_dec_model_eval_rows(const ds4n_dec_model *m, ds4n_pool *pool,
                             ds4n_dec_session *const *sessions, const int32_t *tokens,
                             const int64_t *counts, int n_seq, const int64_t *n_logits,
                             float *logits) {
    if (!n_logits || n_seq < 1 || n_seq > DS4N_DEC_MAX_SEQ) return DS4N_ERR_BAD_BATCH;
    for (int i = 0; i < n_seq; i++)
        if (n_logits[i] < 1 || n_logits[i] > counts[i]) return DS4N_ERR_BAD_BATCH;
    return eval(m, pool, sessions, tokens, counts, n_seq, logits, n_logits);
}

int ds4n_dec_model_embed(const ds4n_dec_model *m, ds4n_pool *pool,
                         ds4n_dec_session *const *sessions, const int32_t *tokens,
                         const int64_t *counts, int n_seq, float *hidden) {
    if (!hidden) return DS4N_ERR_BAD_BATCH;
    const ds4n_dec_shape *s = &m->shape;
    const ds4n_dec_weights *wt = &m->wt;
    ds4n_dec_batch b;
    int rc = ds4n_dec_batch_begin(&b, &m->dims, s->n_layer, sessions, n_seq, counts, pool,
                                  wt->w[DS4N_DEC_TOKEN_EMBD], wt->type[DS4N_DEC_TOKEN_EMBD],
                                  s->n_vocab, tokens, m->embd_scale);
    b.bidir = m->bidirectional;
    if (rc == DS4N_OK) rc = m->layers(m, &b, pool);
    if (rc != DS4N_OK) return rc;
    const int64_t n = b.n_rows * s->n_embd;
    const float *norm = wt->w[DS4N_DEC_OUTPUT_NORM];
    if (norm)
        ds4n_rms_norm(b.x, norm, hidden, b.n_rows, s->n_embd, s->rms_eps);
    else
        memcpy(hidden, b.x, sizeof(float) * (size_t)n);
    ds4n_dec_batch_finish(&b, pool, NULL, 0.0f, NULL, 0, 0, NULL, 0, 0.0f);
    return DS4N_OK;
}

int ds4n_dec_model_bidirectional(const ds4n_dec_model *m) { return m->bidirectional ? 1 : 0; }
