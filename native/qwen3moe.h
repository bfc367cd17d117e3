/* The qwen3moe forward pass (Qwen3-MoE, e.g. Qwen3-30B-A3B, Qwen3-Coder-30B-A3B): one C call
 * evaluates a prefill chunk or one decode token against a session's KV cache.
 *
 * Per layer: RMSNorm; attention (Q/K/V, per-head RMSNorm of q and k, half-split RoPE, causal
 * GQA); residual; RMSNorm; mixture-of-experts FFN (softmax router, top-k, weights
 * renormalised when the file says so, SwiGLU experts; moe.h); residual. The model borrows the
 * weight pointers (the GGUF mmap, kept alive by the caller) and owns the MoE working memory.
 * Calls on the same model and pool must not overlap.
 */
#ifndef DS4N_QWEN3MOE_H
#define DS4N_QWEN3MOE_H

#include <stdint.h>

#include "moe_decoder.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ds4n_qwen3moe_hparams {
    ds4n_dec_shape shape; /* n_ff 0 */
    ds4n_dec_rope_scaling scaling;
    ds4n_moe_experts experts;
    int32_t norm_weights; /* nonzero: the selected experts' weights divided by their sum */
} ds4n_qwen3moe_hparams;

/* Weight slots: decoder_model.h's DS4N_DEC_N_GLOBAL entries, then
 * DS4N_QWEN3MOE_N_PER_LAYER per layer. Norm weights are F32; matrices and expert tensors
 * any supported type. */
enum {
    DS4N_QWEN3MOE_ATTN_NORM, DS4N_QWEN3MOE_WQ, DS4N_QWEN3MOE_WK, DS4N_QWEN3MOE_WV,
    DS4N_QWEN3MOE_WO, DS4N_QWEN3MOE_Q_NORM, DS4N_QWEN3MOE_K_NORM, DS4N_QWEN3MOE_FFN_NORM,
    DS4N_QWEN3MOE_GATE_INP, DS4N_QWEN3MOE_GATE_EXPS, DS4N_QWEN3MOE_UP_EXPS,
    DS4N_QWEN3MOE_DOWN_EXPS,
    DS4N_QWEN3MOE_N_PER_LAYER
};

/* As ds4n_gptoss_new. An eval returns, beside decoder.h's DS4N_ERR_*, moe.h's
 * DS4N_ERR_BAD_EXPERT. */
ds4n_dec_model *ds4n_qwen3moe_new(const ds4n_qwen3moe_hparams *hp, const void *const *tensors,
                                  const int32_t *types);

#ifdef __cplusplus
}
#endif
#endif
