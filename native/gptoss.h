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

#include "decoder.h"
#include "ds4n.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ds4n_gptoss_hparams {
    int32_t n_vocab, n_embd, n_layer, n_head, n_head_kv, head_dim, n_rot;
    int32_t n_expert, n_used, n_ff_exp;
    int32_t window;            /* sliding window of the layers marked in `sliding` */
    const uint8_t *sliding;    /* n_layer flags, copied by ds4n_gptoss_new */
    float rope_base;
    const float *rope_factors; /* n_rot/2 divisors of the angle rates (the YaRN blend) or NULL;
                                  read by ds4n_gptoss_new only */
    float rope_attn_factor;    /* multiplies cos and sin (YaRN's magnitude factor) */
    float rms_eps, swiglu_alpha, swiglu_limit, weights_scale;
} ds4n_gptoss_hparams;

/* Weight slots: DS4N_GPTOSS_N_GLOBAL entries, then DS4N_GPTOSS_N_PER_LAYER per layer.
 * Norm weights, biases and sinks are F32; matrices and experts any type. */
enum {
    DS4N_GPTOSS_TOKEN_EMBD, DS4N_GPTOSS_OUTPUT_NORM, DS4N_GPTOSS_OUTPUT,
    DS4N_GPTOSS_N_GLOBAL
};
enum {
    DS4N_GPTOSS_ATTN_NORM, DS4N_GPTOSS_WQ, DS4N_GPTOSS_WK, DS4N_GPTOSS_WV, DS4N_GPTOSS_WO,
    DS4N_GPTOSS_BQ, DS4N_GPTOSS_BK, DS4N_GPTOSS_BV, DS4N_GPTOSS_BO, DS4N_GPTOSS_SINKS,
    DS4N_GPTOSS_POST_ATTN_NORM, DS4N_GPTOSS_GATE_INP, DS4N_GPTOSS_GATE_INP_B,
    DS4N_GPTOSS_GATE_EXPS, DS4N_GPTOSS_UP_EXPS, DS4N_GPTOSS_DOWN_EXPS,
    DS4N_GPTOSS_GATE_EXPS_B, DS4N_GPTOSS_UP_EXPS_B, DS4N_GPTOSS_DOWN_EXPS_B,
    DS4N_GPTOSS_N_PER_LAYER
};

typedef struct ds4n_gptoss ds4n_gptoss;

/* NULL on a shape the engine cannot run, or no memory. */
ds4n_gptoss *ds4n_gptoss_new(const ds4n_gptoss_hparams *hp, const void *const *tensors,
                             const int32_t *types);
void ds4n_gptoss_free(ds4n_gptoss *model);
/* A session of this model (the ds4n_dec_session_* functions of decoder.h serve it). */
ds4n_dec_session *ds4n_gptoss_session_new(const ds4n_gptoss *model, int64_t n_ctx,
                                          int kv_type);

/* Appends n tokens (as ds4n_qwen3moe_eval). */
int ds4n_gptoss_eval(const ds4n_gptoss *model, ds4n_dec_session *sess, ds4n_pool *pool,
                     const int32_t *tokens, int64_t n, float *logits, int all_logits);

/* Appends counts[i] >= 1 tokens to each of n_seq distinct sessions in one forward pass
 * (the weights read once for all of them; tokens holds each session's tokens in turn).
 * logits (n_seq x n_vocab, may be NULL) receives each session's logits after its last
 * token, bitwise what ds4n_gptoss_eval of that session alone gives. DS4N_OK, or a
 * DS4N_ERR_* of decoder.h with no session changed. */
int ds4n_gptoss_eval_batch(const ds4n_gptoss *model, ds4n_pool *pool,
                           ds4n_dec_session *const *sessions, const int32_t *tokens,
                           const int64_t *counts, int n_seq, float *logits);

/* Bytes of expert weights this model's evals have read so far (moe.h's counter). */
int64_t ds4n_gptoss_expert_bytes(const ds4n_gptoss *model);

#ifdef __cplusplus
}
#endif
#endif
