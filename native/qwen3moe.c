/* The qwen3moe forward pass (see qwen3moe.h), composed from the shared decoder pieces
 * (decoder.h, whose session it uses) and the MoE FFN (moe.h). */
#include "qwen3moe.h"

#include <math.h>
#include <stdlib.h>

#include "moe.h"

struct ds4n_qwen3moe {
    ds4n_qwen3moe_hparams hp;
    ds4n_dec_dims dims;
    ds4n_rope rope;
    ds4n_dec_weights wt;
    ds4n_attn_layer *attn; /* per layer */
    ds4n_moe *moe;         /* per layer */
    ds4n_moe_scratch *scratch; /* the MoE working memory of every eval (they never overlap) */
};

ds4n_qwen3moe *ds4n_qwen3moe_new(const ds4n_qwen3moe_hparams *hp, const void *const *tensors,
                                 const int32_t *types) {
    if (hp->n_layer <= 0 || hp->n_head <= 0 || hp->n_head_kv <= 0 ||
        hp->n_head % hp->n_head_kv != 0 || hp->head_dim <= 0 || hp->n_vocab <= 0 ||
        hp->n_embd <= 0 || hp->n_rot <= 0 || hp->n_rot > hp->head_dim)
        return NULL;
    ds4n_qwen3moe *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->hp = *hp;
    m->dims = (ds4n_dec_dims){.n_embd = hp->n_embd, .n_head = hp->n_head,
                              .n_head_kv = hp->n_head_kv, .head_dim = hp->head_dim,
                              .n_ff = 0, .norm_eps = hp->rms_eps};
    const ds4n_rope_params rp = {.n_rot = hp->n_rot, .mode = DS4N_ROPE_NEOX,
                                 .base = hp->rope_base, .freq_scale = hp->rope_scale,
                                 .ext_factor = hp->yarn_ext_factor,
                                 .attn_factor = hp->rope_attn_factor,
                                 .beta_fast = hp->yarn_beta_fast, .beta_slow = hp->yarn_beta_slow,
                                 .n_ctx_orig = hp->n_ctx_orig};
    const int tables = ds4n_dec_weights_init(&m->wt, DS4N_QWEN3MOE_N_GLOBAL,
                                             DS4N_QWEN3MOE_N_PER_LAYER, hp->n_layer, tensors,
                                             types);
    m->attn = calloc((size_t)hp->n_layer, sizeof *m->attn);
    m->moe = calloc((size_t)hp->n_layer, sizeof *m->moe);
    m->scratch = ds4n_moe_scratch_new();
    if (tables != 0 || !m->attn || !m->moe || !m->scratch ||
        ds4n_rope_init(&m->rope, &rp) != 0) {
        ds4n_qwen3moe_free(m);
        return NULL;
    }
    for (int il = 0; il < hp->n_layer; il++) {
        const void *const *lw = ds4n_dec_layer_w(&m->wt, il);
        const int32_t *lt = ds4n_dec_layer_wt(&m->wt, il);
        m->attn[il] = (ds4n_attn_layer){
            .wq = lw[DS4N_QWEN3MOE_WQ], .wk = lw[DS4N_QWEN3MOE_WK],
            .wv = lw[DS4N_QWEN3MOE_WV], .wo = lw[DS4N_QWEN3MOE_WO],
            .tq = lt[DS4N_QWEN3MOE_WQ], .tk = lt[DS4N_QWEN3MOE_WK],
            .tv = lt[DS4N_QWEN3MOE_WV], .to = lt[DS4N_QWEN3MOE_WO],
            .q_norm = lw[DS4N_QWEN3MOE_Q_NORM], .k_norm = lw[DS4N_QWEN3MOE_K_NORM],
            .rope = &m->rope, .q_scale = 1.0f / sqrtf((float)hp->head_dim), .window = 0,
        };
        m->moe[il] = (ds4n_moe){
            .n_expert = hp->n_expert, .n_used = hp->n_used, .n_embd = hp->n_embd,
            .n_ff = hp->n_ff_exp, .gating = DS4N_MOE_SOFTMAX, .activation = DS4N_MOE_SWIGLU,
            .norm_weights = hp->norm_weights, .weights_scale = hp->weights_scale,
            .router = lw[DS4N_QWEN3MOE_GATE_INP],
            .router_type = lt[DS4N_QWEN3MOE_GATE_INP],
            .gate = lw[DS4N_QWEN3MOE_GATE_EXPS],
            .up = lw[DS4N_QWEN3MOE_UP_EXPS],
            .down = lw[DS4N_QWEN3MOE_DOWN_EXPS],
            .gate_type = lt[DS4N_QWEN3MOE_GATE_EXPS],
            .up_type = lt[DS4N_QWEN3MOE_UP_EXPS],
            .down_type = lt[DS4N_QWEN3MOE_DOWN_EXPS],
        };
        if (!ds4n_moe_valid(&m->moe[il])) {
            ds4n_qwen3moe_free(m);
            return NULL;
        }
    }
    return m;
}

void ds4n_qwen3moe_free(ds4n_qwen3moe *m) {
    if (!m) return;
    ds4n_dec_weights_free(&m->wt);
    free(m->attn);
    free(m->moe);
    ds4n_moe_scratch_free(m->scratch);
    free(m);
}

ds4n_dec_session *ds4n_qwen3moe_session_new(const ds4n_qwen3moe *m, int64_t n_ctx,
                                            int kv_type) {
    return ds4n_dec_session_new(&m->dims, m->hp.n_layer, n_ctx, kv_type);
}

int64_t ds4n_qwen3moe_expert_bytes(const ds4n_qwen3moe *m) { return ds4n_moe_expert_bytes(m->scratch); }

static int eval(const ds4n_qwen3moe *m, ds4n_pool *pool, ds4n_dec_session *const *sessions,
                const int32_t *tokens, const int64_t *counts, int n_seq, float *logits,
                int all_logits) {
    const ds4n_qwen3moe_hparams *hp = &m->hp;
    ds4n_dec_batch b;
    const int rc = ds4n_dec_batch_begin(&b, &m->dims, hp->n_layer, sessions, n_seq, counts, pool,
                                        m->wt.w[DS4N_QWEN3MOE_TOKEN_EMBD],
                                        m->wt.type[DS4N_QWEN3MOE_TOKEN_EMBD], hp->n_vocab, tokens,
                                        1.0f);
    if (rc != DS4N_OK) return rc;
    const int64_t T = b.n_rows;
    if (ds4n_moe_scratch_reserve(m->scratch, &m->moe[0], T) != DS4N_MOE_OK)
        return DS4N_ERR_NO_MEMORY; /* every layer's experts have the same shape */
    const int E = hp->n_embd;
    for (int il = 0; il < hp->n_layer; il++) {
        const void *const *lw = ds4n_dec_layer_w(&m->wt, il);
        ds4n_rms_norm(b.x, lw[DS4N_QWEN3MOE_ATTN_NORM], b.xn, T, E, hp->rms_eps);
        ds4n_attention(&m->dims, &m->attn[il], il, &b, pool, b.xn, b.tmp);
        ds4n_dec_add_rows(b.x, b.tmp, T * E);
        ds4n_rms_norm(b.x, lw[DS4N_QWEN3MOE_FFN_NORM], b.xn, T, E, hp->rms_eps);
        const int mrc = ds4n_moe_forward_batch(pool, &m->moe[il], m->scratch, b.xn, b.count,
                                               b.n_seq, b.tmp);
        if (mrc != DS4N_MOE_OK) /* n_past unchanged: the K/V rows written are not held */
            return mrc == DS4N_MOE_ERR_BAD_EXPERT ? DS4N_ERR_BAD_EXPERT : DS4N_ERR_NO_MEMORY;
        ds4n_dec_add_rows(b.x, b.tmp, T * E);
    }
    const int head =
        m->wt.w[DS4N_QWEN3MOE_OUTPUT] ? DS4N_QWEN3MOE_OUTPUT : DS4N_QWEN3MOE_TOKEN_EMBD;
    ds4n_dec_batch_finish(&b, pool, m->wt.w[DS4N_QWEN3MOE_OUTPUT_NORM], hp->rms_eps,
                          m->wt.w[head], m->wt.type[head], hp->n_vocab, logits, all_logits,
                          0.0f);
    return DS4N_OK;
}

int ds4n_qwen3moe_eval(const ds4n_qwen3moe *m, ds4n_dec_session *s, ds4n_pool *pool,
                       const int32_t *tokens, int64_t T, float *logits, int all_logits) {
    if (T <= 0) return DS4N_OK;
    return eval(m, pool, &s, tokens, &T, 1, logits, all_logits);
}

int ds4n_qwen3moe_eval_batch(const ds4n_qwen3moe *m, ds4n_pool *pool, ds4n_dec_session *const *sessions,
                             const int32_t *tokens, const int64_t *counts, int n_seq, float *logits) {
    return eval(m, pool, sessions, tokens, counts, n_seq, logits, 0);
}

