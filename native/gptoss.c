/* The gpt-oss forward pass (see gptoss.h), composed from the shared decoder pieces
 * (decoder.h, whose session it uses) and the MoE FFN (moe.h). */
#include "gptoss.h"

#include <math.h>
#include <stdlib.h>

#include "moe.h"

struct ds4n_gptoss {
    ds4n_gptoss_hparams hp;
    ds4n_dec_dims dims;
    ds4n_rope rope;
    ds4n_dec_weights wt;
    ds4n_attn_layer *attn; /* per layer */
    ds4n_moe *moe;         /* per layer */
    ds4n_moe_scratch *scratch; /* the MoE working memory of every eval (they never overlap) */
};

ds4n_gptoss *ds4n_gptoss_new(const ds4n_gptoss_hparams *hp, const void *const *tensors,
                             const int32_t *types) {
    if (hp->n_layer <= 0 || hp->n_head <= 0 || hp->n_head_kv <= 0 ||
        hp->n_head % hp->n_head_kv != 0 || hp->head_dim <= 0 || hp->n_vocab <= 0 ||
        hp->n_embd <= 0 || hp->n_rot <= 0 || hp->n_rot > hp->head_dim || hp->window < 0 ||
        !hp->sliding || !tensors[DS4N_GPTOSS_OUTPUT])
        return NULL;
    ds4n_gptoss *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->hp = *hp;
    m->hp.sliding = NULL; /* the caller's arrays are read here, not kept */
    m->hp.rope_factors = NULL;
    m->dims = (ds4n_dec_dims){.n_embd = hp->n_embd, .n_head = hp->n_head,
                              .n_head_kv = hp->n_head_kv, .head_dim = hp->head_dim,
                              .n_ff = 0, .norm_eps = hp->rms_eps};
    const ds4n_rope_params rp = {.n_rot = hp->n_rot, .mode = DS4N_ROPE_NEOX,
                                 .base = hp->rope_base, .freq_scale = 1.0f,
                                 .freq_factors = hp->rope_factors,
                                 .attn_factor = hp->rope_attn_factor};
    const int tables = ds4n_dec_weights_init(&m->wt, DS4N_GPTOSS_N_GLOBAL, DS4N_GPTOSS_N_PER_LAYER,
                                             hp->n_layer, tensors, types);
    m->attn = calloc((size_t)hp->n_layer, sizeof *m->attn);
    m->moe = calloc((size_t)hp->n_layer, sizeof *m->moe);
    m->scratch = ds4n_moe_scratch_new();
    if (tables != 0 || !m->attn || !m->moe || !m->scratch ||
        ds4n_rope_init(&m->rope, &rp) != 0) {
        ds4n_gptoss_free(m);
        return NULL;
    }
    for (int il = 0; il < hp->n_layer; il++) {
        const void *const *lw = ds4n_dec_layer_w(&m->wt, il);
        const int32_t *lt = ds4n_dec_layer_wt(&m->wt, il);
        m->attn[il] = (ds4n_attn_layer){
            .wq = lw[DS4N_GPTOSS_WQ], .wk = lw[DS4N_GPTOSS_WK],
            .wv = lw[DS4N_GPTOSS_WV], .wo = lw[DS4N_GPTOSS_WO],
            .tq = lt[DS4N_GPTOSS_WQ], .tk = lt[DS4N_GPTOSS_WK],
            .tv = lt[DS4N_GPTOSS_WV], .to = lt[DS4N_GPTOSS_WO],
            .bq = lw[DS4N_GPTOSS_BQ], .bk = lw[DS4N_GPTOSS_BK],
            .bv = lw[DS4N_GPTOSS_BV], .bo = lw[DS4N_GPTOSS_BO],
            .sinks = lw[DS4N_GPTOSS_SINKS],
            .rope = &m->rope, .q_scale = 1.0f / sqrtf((float)hp->head_dim),
            .window = hp->sliding[il] ? hp->window : 0,
        };
        m->moe[il] = (ds4n_moe){
            .n_expert = hp->n_expert, .n_used = hp->n_used, .n_embd = hp->n_embd,
            .n_ff = hp->n_ff_exp, .gating = DS4N_MOE_SOFTMAX_WEIGHT,
            .activation = DS4N_MOE_SWIGLU_OAI, .norm_weights = 0,
            .weights_scale = hp->weights_scale, .oai_alpha = hp->swiglu_alpha,
            .oai_limit = hp->swiglu_limit,
            .router = lw[DS4N_GPTOSS_GATE_INP],
            .router_type = lt[DS4N_GPTOSS_GATE_INP],
            .router_bias = lw[DS4N_GPTOSS_GATE_INP_B],
            .gate = lw[DS4N_GPTOSS_GATE_EXPS],
            .up = lw[DS4N_GPTOSS_UP_EXPS],
            .down = lw[DS4N_GPTOSS_DOWN_EXPS],
            .gate_type = lt[DS4N_GPTOSS_GATE_EXPS],
            .up_type = lt[DS4N_GPTOSS_UP_EXPS],
            .down_type = lt[DS4N_GPTOSS_DOWN_EXPS],
            .gate_bias = lw[DS4N_GPTOSS_GATE_EXPS_B],
            .up_bias = lw[DS4N_GPTOSS_UP_EXPS_B],
            .down_bias = lw[DS4N_GPTOSS_DOWN_EXPS_B],
        };
        if (!ds4n_moe_valid(&m->moe[il])) {
            ds4n_gptoss_free(m);
            return NULL;
        }
    }
    return m;
}

void ds4n_gptoss_free(ds4n_gptoss *m) {
    if (!m) return;
    ds4n_dec_weights_free(&m->wt);
    free(m->attn);
    free(m->moe);
    ds4n_moe_scratch_free(m->scratch);
    free(m);
}

ds4n_dec_session *ds4n_gptoss_session_new(const ds4n_gptoss *m, int64_t n_ctx,
                                          int kv_type) {
    return ds4n_dec_session_new(&m->dims, m->hp.n_layer, n_ctx, kv_type);
}

int64_t ds4n_gptoss_expert_bytes(const ds4n_gptoss *m) { return ds4n_moe_expert_bytes(m->scratch); }

static int eval(const ds4n_gptoss *m, ds4n_pool *pool, ds4n_dec_session *const *sessions,
                const int32_t *tokens, const int64_t *counts, int n_seq, float *logits,
                int all_logits) {
    const ds4n_gptoss_hparams *hp = &m->hp;
    ds4n_dec_batch b;
    const int rc = ds4n_dec_batch_begin(&b, &m->dims, hp->n_layer, sessions, n_seq, counts, pool,
                                        m->wt.w[DS4N_GPTOSS_TOKEN_EMBD],
                                        m->wt.type[DS4N_GPTOSS_TOKEN_EMBD], hp->n_vocab, tokens,
                                        1.0f);
    if (rc != DS4N_OK) return rc;
    const int64_t T = b.n_rows;
    if (ds4n_moe_scratch_reserve(m->scratch, &m->moe[0], T) != DS4N_MOE_OK)
        return DS4N_ERR_NO_MEMORY; /* every layer's experts have the same shape */
    const int E = hp->n_embd;
    for (int il = 0; il < hp->n_layer; il++) {
        const void *const *lw = ds4n_dec_layer_w(&m->wt, il);
        ds4n_rms_norm(b.x, lw[DS4N_GPTOSS_ATTN_NORM], b.xn, T, E, hp->rms_eps);
        ds4n_attention(&m->dims, &m->attn[il], il, &b, pool, b.xn, b.tmp);
        ds4n_dec_add_rows(b.x, b.tmp, T * E);
        ds4n_rms_norm(b.x, lw[DS4N_GPTOSS_POST_ATTN_NORM], b.xn, T, E, hp->rms_eps);
        const int mrc = ds4n_moe_forward_batch(pool, &m->moe[il], m->scratch, b.xn, b.count,
                                               b.n_seq, b.tmp);
        if (mrc != DS4N_MOE_OK) /* n_past unchanged: the K/V rows written are not held */
            return mrc == DS4N_MOE_ERR_BAD_EXPERT ? DS4N_ERR_BAD_EXPERT : DS4N_ERR_NO_MEMORY;
        ds4n_dec_add_rows(b.x, b.tmp, T * E);
    }
    ds4n_dec_batch_finish(&b, pool, m->wt.w[DS4N_GPTOSS_OUTPUT_NORM], hp->rms_eps,
                          m->wt.w[DS4N_GPTOSS_OUTPUT], m->wt.type[DS4N_GPTOSS_OUTPUT],
                          hp->n_vocab, logits, all_logits, 0.0f);
    return DS4N_OK;
}

int ds4n_gptoss_eval(const ds4n_gptoss *m, ds4n_dec_session *s, ds4n_pool *pool,
                     const int32_t *tokens, int64_t T, float *logits, int all_logits) {
    if (T <= 0) return DS4N_OK;
    return eval(m, pool, &s, tokens, &T, 1, logits, all_logits);
}

int ds4n_gptoss_eval_batch(const ds4n_gptoss *m, ds4n_pool *pool, ds4n_dec_session *const *sessions,
                           const int32_t *tokens, const int64_t *counts, int n_seq, float *logits) {
    return eval(m, pool, sessions, tokens, counts, n_seq, logits, 0);
}

