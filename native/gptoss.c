/* The gpt-oss forward pass (see gptoss.h), composed from the shared decoder pieces
 * (decoder.h), the MoE FFN (moe.h) and the MoE families' session (moe_session.h). */
#include "gptoss.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "moe_session.h"

struct ds4n_gptoss {
    ds4n_gptoss_hparams hp;
    ds4n_dec_dims dims;
    ds4n_rope rope;
    const void **w; /* DS4N_GPTOSS_N_GLOBAL + n_layer * DS4N_GPTOSS_N_PER_LAYER */
    int32_t *type;
    ds4n_attn_layer *attn; /* per layer */
    ds4n_moe *moe;         /* per layer */
};

static const void *weight(const ds4n_gptoss *m, int il, int slot) {
    return m->w[DS4N_GPTOSS_N_GLOBAL + il * DS4N_GPTOSS_N_PER_LAYER + slot];
}
static int wtype(const ds4n_gptoss *m, int il, int slot) {
    return m->type[DS4N_GPTOSS_N_GLOBAL + il * DS4N_GPTOSS_N_PER_LAYER + slot];
}

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
    m->hp.sliding = NULL; /* the flags are read below; the caller's array is not kept */
    m->dims = (ds4n_dec_dims){.n_embd = hp->n_embd, .n_head = hp->n_head,
                              .n_head_kv = hp->n_head_kv, .head_dim = hp->head_dim,
                              .n_ff = 0, .norm_eps = hp->rms_eps};
    const ds4n_rope_params rp = {.n_rot = hp->n_rot, .mode = DS4N_ROPE_NEOX,
                                 .base = hp->rope_base, .freq_scale = 1.0f,
                                 .freq_factors = tensors[DS4N_GPTOSS_ROPE_FACTORS],
                                 .attn_factor = hp->rope_attn_factor};
    const int n_slots = DS4N_GPTOSS_N_GLOBAL + hp->n_layer * DS4N_GPTOSS_N_PER_LAYER;
    m->w = malloc(sizeof(void *) * n_slots);
    m->type = malloc(sizeof(int32_t) * n_slots);
    m->attn = calloc((size_t)hp->n_layer, sizeof *m->attn);
    m->moe = calloc((size_t)hp->n_layer, sizeof *m->moe);
    if (!m->w || !m->type || !m->attn || !m->moe || ds4n_rope_init(&m->rope, &rp) != 0) {
        ds4n_gptoss_free(m);
        return NULL;
    }
    memcpy(m->w, tensors, sizeof(void *) * n_slots);
    memcpy(m->type, types, sizeof(int32_t) * n_slots);
    for (int il = 0; il < hp->n_layer; il++) {
        m->attn[il] = (ds4n_attn_layer){
            .wq = weight(m, il, DS4N_GPTOSS_WQ), .wk = weight(m, il, DS4N_GPTOSS_WK),
            .wv = weight(m, il, DS4N_GPTOSS_WV), .wo = weight(m, il, DS4N_GPTOSS_WO),
            .tq = wtype(m, il, DS4N_GPTOSS_WQ), .tk = wtype(m, il, DS4N_GPTOSS_WK),
            .tv = wtype(m, il, DS4N_GPTOSS_WV), .to = wtype(m, il, DS4N_GPTOSS_WO),
            .bq = weight(m, il, DS4N_GPTOSS_BQ), .bk = weight(m, il, DS4N_GPTOSS_BK),
            .bv = weight(m, il, DS4N_GPTOSS_BV), .bo = weight(m, il, DS4N_GPTOSS_BO),
            .sinks = weight(m, il, DS4N_GPTOSS_SINKS),
            .rope = &m->rope, .q_scale = 1.0f / sqrtf((float)hp->head_dim),
            .window = hp->sliding[il] ? hp->window : 0,
        };
        m->moe[il] = (ds4n_moe){
            .n_expert = hp->n_expert, .n_used = hp->n_used, .n_embd = hp->n_embd,
            .n_ff = hp->n_ff_exp, .gating = DS4N_MOE_SOFTMAX_WEIGHT,
            .activation = DS4N_MOE_SWIGLU_OAI, .norm_weights = 0,
            .weights_scale = hp->weights_scale, .oai_alpha = hp->swiglu_alpha,
            .oai_limit = hp->swiglu_limit,
            .router = weight(m, il, DS4N_GPTOSS_GATE_INP),
            .router_type = wtype(m, il, DS4N_GPTOSS_GATE_INP),
            .router_bias = weight(m, il, DS4N_GPTOSS_GATE_INP_B),
            .gate = weight(m, il, DS4N_GPTOSS_GATE_EXPS),
            .up = weight(m, il, DS4N_GPTOSS_UP_EXPS),
            .down = weight(m, il, DS4N_GPTOSS_DOWN_EXPS),
            .gate_type = wtype(m, il, DS4N_GPTOSS_GATE_EXPS),
            .up_type = wtype(m, il, DS4N_GPTOSS_UP_EXPS),
            .down_type = wtype(m, il, DS4N_GPTOSS_DOWN_EXPS),
            .gate_bias = weight(m, il, DS4N_GPTOSS_GATE_EXPS_B),
            .up_bias = weight(m, il, DS4N_GPTOSS_UP_EXPS_B),
            .down_bias = weight(m, il, DS4N_GPTOSS_DOWN_EXPS_B),
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
    free(m->w);
    free(m->type);
    free(m->attn);
    free(m->moe);
    free(m);
}

ds4n_moe_session *ds4n_gptoss_session_new(const ds4n_gptoss *m, int64_t n_ctx) {
    return ds4n_moe_session_new(&m->dims, m->hp.n_layer, n_ctx);
}

int ds4n_gptoss_eval(const ds4n_gptoss *m, ds4n_moe_session *s, ds4n_pool *pool,
                     const int32_t *tokens, int64_t T, float *logits, int all_logits) {
    const ds4n_gptoss_hparams *hp = &m->hp;
    if (T <= 0) return DS4N_MOE_SESS_OK;
    const int nth = pool ? ds4n_pool_threads(pool) : 1;
    const int rc = ds4n_moe_session_prepare(s, tokens, T, hp->n_vocab, nth, &m->moe[0]);
    if (rc != DS4N_MOE_SESS_OK) return rc;
    const int E = hp->n_embd;
    ds4n_moe_session_embed(s, m->type[DS4N_GPTOSS_TOKEN_EMBD], m->w[DS4N_GPTOSS_TOKEN_EMBD],
                           tokens, T);
    for (int il = 0; il < hp->n_layer; il++) {
        ds4n_rms_norm(s->x, weight(m, il, DS4N_GPTOSS_ATTN_NORM), s->xn, T, E, hp->rms_eps);
        ds4n_attention(&m->dims, &m->attn[il], &s->kv, il, &s->ws, pool, s->xn, T, s->n_past,
                       s->tmp);
        for (int64_t i = 0; i < T * E; i++) s->x[i] += s->tmp[i];
        ds4n_rms_norm(s->x, weight(m, il, DS4N_GPTOSS_POST_ATTN_NORM), s->xn, T, E,
                      hp->rms_eps);
        const int mrc = ds4n_moe_forward(pool, &m->moe[il], s->moe, s->xn, T, s->tmp);
        if (mrc != DS4N_MOE_OK) return ds4n_moe_session_status(mrc); /* n_past unchanged */
        for (int64_t i = 0; i < T * E; i++) s->x[i] += s->tmp[i];
    }
    s->n_past += T;
    ds4n_moe_session_logits(s, pool, T, m->w[DS4N_GPTOSS_OUTPUT_NORM], hp->rms_eps,
                            m->type[DS4N_GPTOSS_OUTPUT], m->w[DS4N_GPTOSS_OUTPUT], hp->n_vocab,
                            logits, all_logits);
    return DS4N_MOE_SESS_OK;
}
