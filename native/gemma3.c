/* The gemma3 forward pass (see gemma3.h), composed of the decoder pieces. */
#include "gemma3.h"

#include <math.h>
#include <stdlib.h>

struct ds4n_gemma3 {
    ds4n_gemma3_hparams hp;
    ds4n_dec_dims dims;
    ds4n_dec_weights wt;
    ds4n_rope rope_global, rope_local;
};

static int is_local(const ds4n_gemma3_hparams *hp, int il) {
    return hp->window > 0 && il % hp->swa_pattern < hp->swa_pattern - 1;
}

ds4n_gemma3 *ds4n_gemma3_new(const ds4n_gemma3_hparams *hp, const void *const *tensors,
                             const int32_t *types) {
    if (hp->n_layer <= 0 || hp->n_head <= 0 || hp->n_head_kv <= 0 ||
        hp->n_head % hp->n_head_kv != 0 || hp->head_dim <= 0 || hp->n_rot > hp->head_dim ||
        hp->n_vocab <= 0 || hp->n_embd <= 0 || hp->n_ff <= 0 || hp->window < 0 ||
        hp->swa_pattern <= 0 || !(hp->softcap >= 0.0f))
        return NULL;
    ds4n_gemma3 *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->hp = *hp;
    m->dims = (ds4n_dec_dims){.n_embd = hp->n_embd, .n_head = hp->n_head,
                              .n_head_kv = hp->n_head_kv, .head_dim = hp->head_dim,
                              .n_ff = hp->n_ff, .norm_eps = hp->rms_eps};
    const int tables = ds4n_dec_weights_init(&m->wt, DS4N_GEMMA3_N_GLOBAL, DS4N_GEMMA3_N_PER_LAYER,
                                             hp->n_layer, tensors, types);
    const ds4n_rope_params global = {.n_rot = hp->n_rot, .mode = DS4N_ROPE_NEOX,
                                     .base = hp->rope_base, .freq_scale = hp->rope_scale};
    const ds4n_rope_params local = {.n_rot = hp->n_rot, .mode = DS4N_ROPE_NEOX,
                                    .base = hp->rope_base_local, .freq_scale = 1.0f};
    if (tables != 0 || ds4n_rope_init(&m->rope_global, &global) != 0 ||
        ds4n_rope_init(&m->rope_local, &local) != 0) {
        ds4n_gemma3_free(m);
        return NULL;
    }
    return m;
}

void ds4n_gemma3_free(ds4n_gemma3 *m) {
    if (!m) return;
    ds4n_dec_weights_free(&m->wt);
    free(m);
}

ds4n_dec_session *ds4n_gemma3_session_new(const ds4n_gemma3 *m, int64_t n_ctx,
                                          int kv_type) {
    return ds4n_dec_session_new(&m->dims, m->hp.n_layer, n_ctx, kv_type);
}

static int eval(const ds4n_gemma3 *m, ds4n_pool *pool, ds4n_dec_session *const *sessions,
                const int32_t *tokens, const int64_t *counts, int n_seq, float *logits,
                int all_logits) {
    const ds4n_gemma3_hparams *hp = &m->hp;
    ds4n_dec_batch b;
    const int rc = ds4n_dec_batch_begin(&b, &m->dims, hp->n_layer, sessions, n_seq, counts, pool,
                                        m->wt.w[DS4N_GEMMA3_TOKEN_EMBD],
                                        m->wt.type[DS4N_GEMMA3_TOKEN_EMBD], hp->n_vocab, tokens,
                                        sqrtf((float)hp->n_embd));
    if (rc != DS4N_OK) return rc;
    const int64_t T = b.n_rows;
    const int E = hp->n_embd;
    for (int il = 0; il < hp->n_layer; il++) {
        const void *const *lw = ds4n_dec_layer_w(&m->wt, il);
        const int32_t *lt = ds4n_dec_layer_wt(&m->wt, il);
        const int local = is_local(hp, il);
        const ds4n_attn_layer al = {
            .wq = lw[DS4N_GEMMA3_WQ], .tq = lt[DS4N_GEMMA3_WQ],
            .wk = lw[DS4N_GEMMA3_WK], .tk = lt[DS4N_GEMMA3_WK],
            .wv = lw[DS4N_GEMMA3_WV], .tv = lt[DS4N_GEMMA3_WV],
            .wo = lw[DS4N_GEMMA3_WO], .to = lt[DS4N_GEMMA3_WO],
            .q_norm = lw[DS4N_GEMMA3_Q_NORM], .k_norm = lw[DS4N_GEMMA3_K_NORM],
            .rope = local ? &m->rope_local : &m->rope_global, .q_scale = hp->q_scale,
            .window = local ? hp->window : 0,
        };
        ds4n_rms_norm(b.x, lw[DS4N_GEMMA3_ATTN_NORM], b.xn, T, E, hp->rms_eps);
        ds4n_attention(&m->dims, &al, il, &b, pool, b.xn, b.tmp);
        ds4n_rms_norm(b.tmp, lw[DS4N_GEMMA3_POST_ATTN_NORM], b.tmp, T, E, hp->rms_eps);
        ds4n_dec_add_rows(b.x, b.tmp, T * E);

        const ds4n_ffn_layer fl = {
            .gate = lw[DS4N_GEMMA3_W_GATE], .tgate = lt[DS4N_GEMMA3_W_GATE],
            .up = lw[DS4N_GEMMA3_W_UP], .tup = lt[DS4N_GEMMA3_W_UP],
            .down = lw[DS4N_GEMMA3_W_DOWN], .tdown = lt[DS4N_GEMMA3_W_DOWN],
            .act = DS4N_ACT_GELU_TANH,
        };
        ds4n_rms_norm(b.x, lw[DS4N_GEMMA3_FFN_NORM], b.xn, T, E, hp->rms_eps);
        ds4n_ffn(&m->dims, &fl, &b, pool, b.xn, b.tmp);
        ds4n_rms_norm(b.tmp, lw[DS4N_GEMMA3_POST_FFN_NORM], b.tmp, T, E, hp->rms_eps);
        ds4n_dec_add_rows(b.x, b.tmp, T * E);
    }
    const int head = m->wt.w[DS4N_GEMMA3_OUTPUT] ? DS4N_GEMMA3_OUTPUT : DS4N_GEMMA3_TOKEN_EMBD;
    ds4n_dec_batch_finish(&b, pool, m->wt.w[DS4N_GEMMA3_OUTPUT_NORM], hp->rms_eps, m->wt.w[head],
                          m->wt.type[head], hp->n_vocab, logits, all_logits, hp->softcap);
    return DS4N_OK;
}

int ds4n_gemma3_eval(const ds4n_gemma3 *m, ds4n_dec_session *s, ds4n_pool *pool,
                     const int32_t *tokens, int64_t T, float *logits, int all_logits) {
    if (T <= 0) return DS4N_OK;
    return eval(m, pool, &s, tokens, &T, 1, logits, all_logits);
}

int ds4n_gemma3_eval_batch(const ds4n_gemma3 *m, ds4n_pool *pool, ds4n_dec_session *const *sessions,
                           const int32_t *tokens, const int64_t *counts, int n_seq, float *logits) {
    return eval(m, pool, sessions, tokens, counts, n_seq, logits, 0);
}

