/* The gpt-oss forward pass (see gptoss.h): its layers described for the shared MoE decoder
 * (moe_decoder.h). */
#include "gptoss.h"

#include <math.h>

typedef struct gptoss {
    ds4n_moe_decoder moe; /* first: the model is freed and evaluated through it */
    ds4n_rope rope;
} gptoss;

static void describe_layer(ds4n_moe_decoder *m, int il, const void *const *lw,
                           const int32_t *lt, const void *params) {
    const ds4n_gptoss_hparams *hp = params;
    ds4n_moe_layer *l = &m->layer[il];
    l->attn_norm = lw[DS4N_GPTOSS_ATTN_NORM];
    l->ffn_norm = lw[DS4N_GPTOSS_POST_ATTN_NORM];
    l->attn = (ds4n_attn_layer){
        .wq = lw[DS4N_GPTOSS_WQ], .wk = lw[DS4N_GPTOSS_WK],
        .wv = lw[DS4N_GPTOSS_WV], .wo = lw[DS4N_GPTOSS_WO],
        .tq = lt[DS4N_GPTOSS_WQ], .tk = lt[DS4N_GPTOSS_WK],
        .tv = lt[DS4N_GPTOSS_WV], .to = lt[DS4N_GPTOSS_WO],
        .bq = lw[DS4N_GPTOSS_BQ], .bk = lw[DS4N_GPTOSS_BK],
        .bv = lw[DS4N_GPTOSS_BV], .bo = lw[DS4N_GPTOSS_BO],
        .sinks = lw[DS4N_GPTOSS_SINKS],
        .rope = &((const gptoss *)m)->rope,
        .q_scale = 1.0f / sqrtf((float)hp->shape.head_dim),
        .window = hp->sliding[il] ? hp->window : 0,
    };
    l->moe = (ds4n_moe){
        .n_expert = hp->experts.n_expert, .n_used = hp->experts.n_used,
        .n_embd = hp->shape.n_embd, .n_ff = hp->experts.n_ff,
        .gating = DS4N_MOE_SOFTMAX_WEIGHT, .activation = DS4N_MOE_SWIGLU_OAI,
        .norm_weights = 0, .weights_scale = hp->experts.weights_scale,
        .oai_alpha = hp->swiglu_alpha, .oai_limit = hp->swiglu_limit,
        .router = lw[DS4N_GPTOSS_GATE_INP], .router_type = lt[DS4N_GPTOSS_GATE_INP],
        .router_bias = lw[DS4N_GPTOSS_GATE_INP_B],
        .gate = lw[DS4N_GPTOSS_GATE_EXPS], .gate_type = lt[DS4N_GPTOSS_GATE_EXPS],
        .up = lw[DS4N_GPTOSS_UP_EXPS], .up_type = lt[DS4N_GPTOSS_UP_EXPS],
        .down = lw[DS4N_GPTOSS_DOWN_EXPS], .down_type = lt[DS4N_GPTOSS_DOWN_EXPS],
        .gate_bias = lw[DS4N_GPTOSS_GATE_EXPS_B],
        .up_bias = lw[DS4N_GPTOSS_UP_EXPS_B],
        .down_bias = lw[DS4N_GPTOSS_DOWN_EXPS_B],
    };
}

ds4n_dec_model *ds4n_gptoss_new(const ds4n_gptoss_hparams *hp, const void *const *tensors,
                                const int32_t *types) {
    if (hp->window < 0 || !hp->sliding || !tensors[DS4N_DEC_OUTPUT]) return NULL;
    gptoss *m = ds4n_moe_decoder_new(sizeof *m, &hp->shape, DS4N_GPTOSS_N_PER_LAYER, tensors,
                                     types, describe_layer, hp);
    if (!m) return NULL;
    ds4n_rope_params rp = ds4n_dec_rope_params(&hp->shape, DS4N_ROPE_NEOX, NULL,
                                               hp->rope_factors);
    rp.attn_factor = hp->rope_attn_factor;
    if (ds4n_rope_init(&m->rope, &rp) != 0) {
        ds4n_dec_model_free(&m->moe.base);
        return NULL;
    }
    return &m->moe.base;
}
