/* The qwen3moe forward pass (Qwen3-MoE, e.g. Qwen3-30B-A3B, Qwen3-Coder-30B-A3B): one C call
 * evaluates a prefill chunk or one decode token against a session's KV cache.
 *
 * Per layer: RMSNorm; attention (Q/K/V, per-head RMSNorm of q and k, half-split RoPE, causal
 * GQA); residual; RMSNorm; mixture-of-experts FFN (softmax router, top-k, weights
 * renormalised when the file says so, SwiGLU experts; moe.h); residual. The model borrows the
 * weight pointers (the GGUF mmap, kept alive by the caller). Calls on the same model and
 * pool must not overlap.
 */
#ifndef DS4N_QWEN3MOE_H
#define DS4N_QWEN3MOE_H

#include <stdint.h>

#include "ds4n.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ds4n_qwen3moe_hparams {
    int32_t n_vocab, n_embd, n_layer, n_head, n_head_kv, head_dim, n_rot;
    int32_t n_expert, n_used, n_ff_exp, norm_weights;
    float weights_scale;   /* 0 or 1: none */
    float rope_base, rope_freq_scale, rms_eps;
    /* YaRN (rope_ext_factor > 0; decoder.h's ds4n_rope_params), else ignored */
    float rope_ext_factor, rope_attn_factor, rope_beta_fast, rope_beta_slow;
    int32_t rope_n_ctx_orig;
} ds4n_qwen3moe_hparams;

/* Weight slots: DS4N_QWEN3MOE_N_GLOBAL entries, then DS4N_QWEN3MOE_N_PER_LAYER per layer.
 * Norm weights are F32; matrices and expert tensors any supported type. */
enum {
    DS4N_QWEN3MOE_TOKEN_EMBD, DS4N_QWEN3MOE_OUTPUT_NORM,
    DS4N_QWEN3MOE_OUTPUT, /* optional: tied to TOKEN_EMBD when NULL */
    DS4N_QWEN3MOE_N_GLOBAL
};
enum {
    DS4N_QWEN3MOE_ATTN_NORM, DS4N_QWEN3MOE_WQ, DS4N_QWEN3MOE_WK, DS4N_QWEN3MOE_WV,
    DS4N_QWEN3MOE_WO, DS4N_QWEN3MOE_Q_NORM, DS4N_QWEN3MOE_K_NORM, DS4N_QWEN3MOE_FFN_NORM,
    DS4N_QWEN3MOE_GATE_INP, DS4N_QWEN3MOE_GATE_EXPS, DS4N_QWEN3MOE_UP_EXPS,
    DS4N_QWEN3MOE_DOWN_EXPS,
    DS4N_QWEN3MOE_N_PER_LAYER
};

typedef struct ds4n_qwen3moe ds4n_qwen3moe;
typedef struct ds4n_moe_session ds4n_moe_session; /* moe_session.h */

/* NULL on a shape the engine cannot run, or no memory. */
ds4n_qwen3moe *ds4n_qwen3moe_new(const ds4n_qwen3moe_hparams *hp, const void *const *tensors,
                                 const int32_t *types);
void ds4n_qwen3moe_free(ds4n_qwen3moe *model);
ds4n_moe_session *ds4n_qwen3moe_session_new(const ds4n_qwen3moe *model, int64_t n_ctx);

/* Appends n tokens (see ds4n_moe_session_eval for the contract and return codes). */
int ds4n_qwen3moe_eval(const ds4n_qwen3moe *model, ds4n_moe_session *sess, ds4n_pool *pool,
                       const int32_t *tokens, int64_t n, float *logits, int all_logits);

#ifdef __cplusplus
}
#endif
#endif
