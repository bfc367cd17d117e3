/* The gpt-oss forward pass (GGUF architecture `gpt-oss`, e.g. gpt-oss-20b): one C call
 * evaluates a prefill chunk or one decode token against a session's KV cache.
 *
 * Per layer: RMSNorm; attention (Q/K/V with biases, half-split RoPE with the file's YaRN
 * rates, causal GQA with per-head sink logits, a sliding window on the layers the file
 * marks, output projection with bias); residual; RMSNorm; mixture-of-experts FFN (router with
 * bias, top-k of the logits then softmax over the selected, clamped SwiGLU experts with
 * biases; moe.h); residual. The model borrows the weight pointers and owns the MoE working
 * memory. Calls on the same model and pool must not overlap.
 */
#ifndef DS4N_GPTOSS_H
#define DS4N_GPTOSS_H

#include <stdint.h>

#include "moe_decoder.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ds4n_gptoss_hparams {
    ds4n_dec_shape shape;      /* n_ff 0 */
    ds4n_moe_experts experts;
    int32_t window;            /* sliding window of the layers marked in `sliding` */
    const uint8_t *sliding;    /* n_layer flags, read by ds4n_gptoss_new only */
    const float *rope_factors; /* n_rot/2 divisors of the angle rates (the YaRN blend) or NULL;
                                  read by ds4n_gptoss_new only */
    float rope_attn_factor;    /* multiplies cos and sin (YaRN's magnitude factor) */
    float swiglu_alpha, swiglu_limit;
} ds4n_gptoss_hparams;

/* Weight slots: decoder_model.h's DS4N_DEC_N_GLOBAL entries (the output head required),
 * then DS4N_GPTOSS_N_PER_LAYER per layer. Norm weights, biases and sinks are F32; matrices
 * and experts any type. */
enum {
    DS4N_GPTOSS_ATTN_NORM, DS4N_GPTOSS_WQ, DS4N_GPTOSS_WK, DS4N_GPTOSS_WV, DS4N_GPTOSS_WO,
    DS4N_GPTOSS_BQ, DS4N_GPTOSS_BK, DS4N_GPTOSS_BV, DS4N_GPTOSS_BO, DS4N_GPTOSS_SINKS,
    DS4N_GPTOSS_POST_ATTN_NORM, DS4N_GPTOSS_GATE_INP, DS4N_GPTOSS_GATE_INP_B,
    DS4N_GPTOSS_GATE_EXPS, DS4N_GPTOSS_UP_EXPS, DS4N_GPTOSS_DOWN_EXPS,
    DS4N_GPTOSS_GATE_EXPS_B, DS4N_GPTOSS_UP_EXPS_B, DS4N_GPTOSS_DOWN_EXPS_B,
    DS4N_GPTOSS_N_PER_LAYER
};

/* NULL on a shape the engine cannot run, or no memory. The model is freed, and its sessions
 * made and evaluated, by decoder_model.h's ds4n_dec_model_* functions; moe_decoder.h's
 * ds4n_moe_decoder_expert_bytes counts the expert bytes its evals read. */
ds4n_dec_model *ds4n_gptoss_new(const ds4n_gptoss_hparams *hp, const void *const *tensors,
                                const int32_t *types);

#ifdef __cplusplus
}
#endif
#endif
