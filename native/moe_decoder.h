/* The decoder of the mixture-of-experts families (qwen3moe.c, gptoss.c): every layer is
 * RMSNorm, attention, residual, RMSNorm, MoE FFN (moe.h), residual, so the layer loop is
 * shared; a family describes each layer (its norms, its attention, its experts) once at
 * load (ds4n_moe_layer_fn), and its C file holds only that description, its checks of its
 * own hyper-parameters and its RoPE.
 *
 * The model (ds4n_moe_decoder, the first member of a family's model struct, itself starting
 * with decoder_model.h's ds4n_dec_model) owns the per-layer descriptions and the MoE working
 * memory every eval uses (evals on one model never overlap). */
#ifndef DS4N_MOE_DECODER_H
#define DS4N_MOE_DECODER_H

#include <stddef.h>
#include <stdint.h>

#include "decoder_model.h"
#include "moe.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The expert hyper-parameters every such family has (a member of its hparams struct). */
typedef struct ds4n_moe_experts {
    int32_t n_expert, n_used, n_ff; /* experts, used per token, each one's FFN width */
    float weights_scale;            /* multiplies the final weights; 0 or 1: none */
} ds4n_moe_experts;

typedef struct ds4n_moe_layer {
    const float *attn_norm, *ffn_norm;
    ds4n_attn_layer attn;
    ds4n_moe moe;
} ds4n_moe_layer;

typedef struct ds4n_moe_decoder {
    ds4n_dec_model base;       /* first: the model is freed and evaluated through it */
    ds4n_moe_layer *layer;     /* n_layer, filled by the family */
    ds4n_moe_scratch *scratch;
} ds4n_moe_decoder;

/* Describes layer il of m (m->layer[il]: norms, attention, experts) from its weight slots
 * (lw, lt: decoder.h's ds4n_dec_layer_w / _wt) and the family's hyper-parameters hp. */
typedef void (*ds4n_moe_layer_fn)(ds4n_moe_decoder *m, int il, const void *const *lw,
                                  const int32_t *lt, const void *hp);

/* ds4n_dec_model_new of a model struct of size bytes whose first member is a
 * ds4n_moe_decoder (the global slots are decoder_model.h's three), with the layer array
 * and the scratch allocated and every layer described by describe(..., hp). The shape's
 * n_ff must be 0 (no dense FFN). NULL on a bad shape, on layers whose experts are not
 * ds4n_moe_valid, as wide as the model and of layer 0's sizes (the scratch is reserved
 * once per eval for all of them), or no memory. */
void *ds4n_moe_decoder_new(size_t size, const ds4n_dec_shape *shape, int n_per_layer,
                           const void *const *tensors, const int32_t *types,
                           ds4n_moe_layer_fn describe, const void *hp);

/* Bytes of expert weights this model's evals have read so far (moe.h's counter); -1 for a
 * model that is not a MoE decoder. */
int64_t ds4n_moe_decoder_expert_bytes(const ds4n_dec_model *m);

#ifdef __cplusplus
}
#endif
#endif
