/* The llama-layer forward pass (see llama.h), composed of the shared decoder pieces
 * (decoder.h), for llama itself and for Qwen 2 / Qwen 3, which differ from it only in
 * their RoPE pairing and optional parts. Per layer: RMSNorm, attention (Q/K/V with
 * optional biases, optional per-head q/k RMSNorm, RoPE, causal GQA over the KV cache,
 * output projection), residual, RMSNorm, SwiGLU FFN, residual. */
#include "llama.h"

#include <math.h>
#include <stdlib.h>

struct ds4n_llama {
    ds4n_llama_hparams hp;
    ds4n_dec_dims dims;
    ds4n_dec_weights wt;
    ds4n_rope rope;
};

/* ---- model ------------------------------------------------------------------------ */

ds4n_llama *ds4n_llama_new(const ds4n_llama_hparams *hp, const void *const *tensors,
                           const int32_t *types) {
    if (hp->n_layer <= 0 || hp->n_head <= 0 || hp->n_head_kv <= 0 ||
        hp->n_head % hp->n_head_kv != 0 || hp->head_dim <= 0 || hp->head_dim % 2 != 0 ||
        hp->n_rot <= 0 || hp->n_rot > hp->head_dim || hp->n_rot % 2 != 0 ||
        hp->n_vocab <= 0 || hp->n_embd <= 0 || hp->n_ff <= 0)
        return NULL;
    ds4n_llama *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->hp = *hp;
    m->dims = (ds4n_dec_dims){.n_embd = hp->n_embd, .n_head = hp->n_head,
                              .n_head_kv = hp->n_head_kv, .head_dim = hp->head_dim,
                              .n_ff = hp->n_ff, .norm_eps = hp->rms_eps};
    const int tables = ds4n_dec_weights_init(&m->wt, DS4N_LLAMA_N_GLOBAL, DS4N_LLAMA_N_PER_LAYER,
                                             hp->n_layer, tensors, types);
    if (tables != 0) {
        ds4n_llama_free(m);
        return NULL;
    }
    const ds4n_rope_params rp = {
        .n_rot = hp->n_rot, .mode = hp->rope_neox ? DS4N_ROPE_NEOX : DS4N_ROPE_NORMAL, .base = hp->rope_base,
        .freq_scale = hp->rope_scale, .freq_factors = m->wt.w[DS4N_LLAMA_ROPE_FREQS],
        .ext_factor = hp->yarn_ext_factor, .attn_factor = hp->rope_attn_factor,
        .beta_fast = hp->yarn_beta_fast, .beta_slow = hp->yarn_beta_slow,
        .n_ctx_orig = hp->n_ctx_orig,
    };
    if (ds4n_rope_init(&m->rope, &rp) != 0) {
        ds4n_llama_free(m);
        return NULL;
    }
    return m;
}

void ds4n_llama_free(ds4n_llama *m) {
    if (!m) return;
    ds4n_dec_weights_free(&m->wt);
    free(m);
}

/* ---- session ---------------------------------------------------------------------- */

ds4n_dec_session *ds4n_llama_session_new(const ds4n_llama *m, int64_t n_ctx,
                                         int kv_type) {
    return ds4n_dec_session_new(&m->dims, m->hp.n_layer, n_ctx, kv_type);
}

/* ---- eval ----------------------------------------------------------------------------- */

static int eval(const ds4n_llama *m, ds4n_pool *pool, ds4n_dec_session *const *sessions,
                const int32_t *tokens, const int64_t *counts, int n_seq, float *logits,
                int all_logits) {
    const ds4n_llama_hparams *hp = &m->hp;
    ds4n_dec_batch b;
    const int rc = ds4n_dec_batch_begin(&b, &m->dims, hp->n_layer, sessions, n_seq, counts, pool,
                                        m->wt.w[DS4N_LLAMA_TOKEN_EMBD],
                                        m->wt.type[DS4N_LLAMA_TOKEN_EMBD], hp->n_vocab, tokens,
                                        1.0f);
    if (rc != DS4N_OK) return rc;
    const int E = hp->n_embd;
    const int64_t T = b.n_rows;
    for (int il = 0; il < hp->n_layer; il++) {
        const void *const *lw = ds4n_dec_layer_w(&m->wt, il);
        const int32_t *lt = ds4n_dec_layer_wt(&m->wt, il);
        const ds4n_attn_layer al = {
            .wq = lw[DS4N_LLAMA_WQ], .tq = lt[DS4N_LLAMA_WQ],
            .wk = lw[DS4N_LLAMA_WK], .tk = lt[DS4N_LLAMA_WK],
            .wv = lw[DS4N_LLAMA_WV], .tv = lt[DS4N_LLAMA_WV],
            .wo = lw[DS4N_LLAMA_WO], .to = lt[DS4N_LLAMA_WO],
            .bq = lw[DS4N_LLAMA_BQ], .bk = lw[DS4N_LLAMA_BK],
            .bv = lw[DS4N_LLAMA_BV], .bo = lw[DS4N_LLAMA_BO],
            .q_norm = lw[DS4N_LLAMA_Q_NORM], .k_norm = lw[DS4N_LLAMA_K_NORM],
            .rope = &m->rope, .q_scale = 1.0f / sqrtf((float)hp->head_dim),
        };
        ds4n_rms_norm(b.x, lw[DS4N_LLAMA_ATTN_NORM], b.xn, T, E, hp->rms_eps);
        ds4n_attention(&m->dims, &al, il, &b, pool, b.xn, b.tmp);
        ds4n_dec_add_rows(b.x, b.tmp, T * E);

        const ds4n_ffn_layer fl = {
            .gate = lw[DS4N_LLAMA_W_GATE], .tgate = lt[DS4N_LLAMA_W_GATE],
            .up = lw[DS4N_LLAMA_W_UP], .tup = lt[DS4N_LLAMA_W_UP],
            .down = lw[DS4N_LLAMA_W_DOWN], .tdown = lt[DS4N_LLAMA_W_DOWN],
            .act = DS4N_ACT_SILU,
        };
        ds4n_rms_norm(b.x, lw[DS4N_LLAMA_FFN_NORM], b.xn, T, E, hp->rms_eps);
        ds4n_ffn(&m->dims, &fl, &b, pool, b.xn, b.tmp);
        ds4n_dec_add_rows(b.x, b.tmp, T * E);
    }
    const int head = m->wt.w[DS4N_LLAMA_OUTPUT] ? DS4N_LLAMA_OUTPUT : DS4N_LLAMA_TOKEN_EMBD;
    ds4n_dec_batch_finish(&b, pool, m->wt.w[DS4N_LLAMA_OUTPUT_NORM], hp->rms_eps, m->wt.w[head],
                          m->wt.type[head], hp->n_vocab, logits, all_logits, 0.0f);
    return DS4N_OK;
}

int ds4n_llama_eval(const ds4n_llama *m, ds4n_dec_session *s, ds4n_pool *pool,
                    const int32_t *tokens, int64_t T, float *logits, int all_logits) {
    if (T <= 0) return DS4N_OK;
    return eval(m, pool, &s, tokens, &T, 1, logits, all_logits);
}

int ds4n_llama_eval_batch(const ds4n_llama *m, ds4n_pool *pool, ds4n_dec_session *const *sessions,
                          const int32_t *tokens, const int64_t *counts, int n_seq, float *logits) {
    return eval(m, pool, sessions, tokens, counts, n_seq, logits, 0);
}

