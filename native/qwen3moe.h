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

#include "decoder.h"
#include "ds4n.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ds4n_qwen3moe_hparams {
    int32_t n_vocab, n_embd, n_layer, n_head, n_head_kv, head_dim, n_rot;
    int32_t n_expert, n_used, n_ff_exp, norm_weights;
    float weights_scale;   /* 0 or 1: none */
    float rope_base, rms_eps;
    /* decoder.h's ds4n_rope_params: freq_scale, YaRN (ext_factor > 0), cos/sin factor */
    float rope_scale, yarn_ext_factor, rope_attn_factor, yarn_beta_fast, yarn_beta_slow;
    int32_t n_ctx_orig;
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

/* NULL on a shape the engine cannot run, or no memory. */
ds4n_qwen3moe *ds4n_qwen3moe_new(const ds4n_qwen3moe_hparams *hp, const void *const *tensors,
                                 const int32_t *types);
void ds4n_qwen3moe_free(ds4n_qwen3moe *model);
/* A session of this model (the ds4n_dec_session_* functions of decoder.h serve it). */
ds4n_dec_session *ds4n_qwen3moe_session_new(const ds4n_qwen3moe *model, int64_t n_ctx,
                                            int kv_type);

/* Appends n tokens at position n_past (as ds4n_llama_eval); the MoE scratch is the model's
 * (its calls never overlap). DS4N_OK, a DS4N_ERR_* of decoder.h, or DS4N_ERR_BAD_EXPERT of
 * moe.h; on an error nothing changes. */
int ds4n_qwen3moe_eval(const ds4n_qwen3moe *model, ds4n_dec_session *sess, ds4n_pool *pool,
                       const int32_t *tokens, int64_t n, float *logits, int all_logits);

/* Appends counts[i] >= 1 tokens to each of n_seq distinct sessions in one forward pass
 * (the weights read once for all of them; tokens holds each session's tokens in turn).
 * logits (n_seq x n_vocab, may be NULL) receives each session's logits after its last
 * token, bitwise what ds4n_qwen3moe_eval of that session alone gives. DS4N_OK, or a
 * DS4N_ERR_* of decoder.h with no session changed. */
int ds4n_qwen3moe_eval_batch(const ds4n_qwen3moe *model, ds4n_pool *pool,
                             ds4n_dec_session *const *sessions, const int32_t *tokens,
                             const int64_t *counts, int n_seq, float *logits);

/* Bytes of expert weights this model's evals have read so far (moe.h's counter). */
int64_t ds4n_qwen3moe_expert_bytes(const ds4n_qwen3moe *model);

#ifdef __cplusplus
}
#endif
#endif
