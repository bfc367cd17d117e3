/* The qwen3moe forward pass (see qwen3moe.h): its layers described for the shared MoE
 * decoder (moe_decoder.h). */
#include "qwen3moe.h"

#include <math.h>

typedef struct qwen3moe {
    ds4n_moe_decoder moe; /* first: the model is freed and evaluated through it */
    ds4n_rope rope;
} qwen3moe;

static void describe_layer(ds4n_moe_decoder *m, int il, const void *const *lw,
                           const int32_t *lt, const void *params) {
    const ds4n_qwen3moe_hparams *hp = params;
    ds4n_moe_layer *l = &m->layer[il];
    l->attn_norm = lw[DS4N_QWEN3MOE_ATTN_NORM];
    l->ffn_norm = lw[DS4N_QWEN3MOE_FFN_NORM];
    l->attn = (ds4n_attn_layer){
        .wq = lw[DS4N_QWEN3MOE_WQ], .wk = lw[DS4N_QWEN3MOE_WK],
        .wv = lw[DS4N_QWEN3MOE_WV], .wo = lw[DS4N_QWEN3MOE_WO],
        .tq = lt[DS4N_QWEN3MOE_WQ], .tk = lt[DS4N_QWEN3MOE_WK],
        .tv = lt[DS4N_QWEN3MOE_WV], .to = lt[DS4N_QWEN3MOE_WO],
        .q_norm = lw[DS4N_QWEN3MOE_Q_NORM], .k_norm = lw[DS4N_QWEN3MOE_K_NORM],
        .rope = &((const qwen3moe *)m)->rope,
        .q_scale = 1.0f / sqrtf((float)hp->shape.head_dim), .window = 0,
    };
    l->moe = (ds4n_moe){
        .n_expert = hp->experts.n_expert, .n_used = hp->experts.n_used,
        .n_embd = hp->shape.n_embd, .n_ff = hp->experts.n_ff,
        .gating = DS4N_MOE_SOFTMAX, .activation = DS4N_MOE_SWIGLU,
        .norm_weights = hp->norm_weights, .weights_scale = hp->experts.weights_scale,
        .router = lw[DS4N_QWEN3MOE_GATE_INP], .router_type = lt[DS4N_QWEN3MOE_GATE_INP],
        .gate = lw[DS4N_QWEN3MOE_GATE_EXPS], .gate_type = lt[DS4N_QWEN3MOE_GATE_EXPS],
        .up = lw[DS4N_QWEN3MOE_UP_EXPS], .up_type = lt[DS4N_QWEN3MOE_UP_EXPS],
        .down = lw[DS4N_QWEN3MOE_DOWN_EXPS], .down_type = lt[DS4N_QWEN3MOE_DOWN_EXPS],
    };
}

ds4n_dec_model *ds4n_qwen3moe_new(const ds4n_qwen3moe_hparams *hp, const void *const *tensors,
                                  const int32_t *types) {
    qwen3moe *m = ds4n_moe_decoder_new(sizeof *m, &hp->shape, DS4N_QWEN3MOE_N_PER_LAYER,
                                       tensors, types, describe_layer, hp);
    if (!m) return NULL;
    const ds4n_rope_params rp =
        ds4n_dec_rope_params(&hp->shape, DS4N_ROPE_NEOX, &hp->scaling, NULL);
    if (ds4n_rope_init(&m->rope, &rp) != 0) {
        ds4n_dec_model_free(&m->moe.base);
        return NULL;
    }
    return &m->moe.base;
}
