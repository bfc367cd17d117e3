/* The llama-family forward pass: one C call evaluates a whole prefill chunk or one decode
 * token (embedding, every layer, final norm, output head) against a session's KV cache.
 *
 * The model borrows the weight pointers (the GGUF mmap, kept alive by the caller) and
 * copies nothing. A session (decoder.h) owns its KV cache (float32, f16 or q8_0: kv_type),
 * sized to its n_ctx, in C memory (zero pages until touched). Calls on the same model and pool must not overlap; the
 * functions never touch Python objects.
 */
#ifndef DS4N_LLAMA_H
#define DS4N_LLAMA_H

#include <stdint.h>

#include "decoder.h"
#include "ds4n.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ds4n_llama_hparams {
    int32_t n_vocab, n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_rot;
    float rope_base;       /* theta_i = pos * rope_scale * rope_base^(-2i/n_rot) / freq_factor_i */
    float rope_scale;      /* 1 / linear scaling factor (1 when unscaled) */
    float rms_eps;
    /* YaRN (yarn_ext_factor > 0) and the rope attention factor (0 or 1: none); see
     * ds4n_rope_params in decoder.h. */
    float yarn_ext_factor, rope_attn_factor, yarn_beta_fast, yarn_beta_slow;
    int32_t n_ctx_orig;
    /* RoPE pairs: 0 llama.cpp's NORMAL (adjacent values, llama), 1 NEOX (the two halves of
     * the rotated dims, Qwen 2/3). */
    int32_t rope_neox;
} ds4n_llama_hparams;

/* Weight slots: tensors[] and types[] hold DS4N_LLAMA_N_GLOBAL entries, then
 * DS4N_LLAMA_N_PER_LAYER entries per layer. Absent optional tensors are NULL.
 * Norm weights, biases and rope factors are F32; matrices any supported type, GGUF layout
 * (rows of ne0 = input width). */
enum {
    DS4N_LLAMA_TOKEN_EMBD, /* n_vocab rows of n_embd */
    DS4N_LLAMA_OUTPUT_NORM,
    DS4N_LLAMA_OUTPUT,     /* optional: tied to TOKEN_EMBD when NULL */
    DS4N_LLAMA_ROPE_FREQS, /* optional: n_rot/2 frequency factors */
    DS4N_LLAMA_N_GLOBAL
};
enum {
    DS4N_LLAMA_ATTN_NORM, DS4N_LLAMA_WQ, DS4N_LLAMA_WK, DS4N_LLAMA_WV, DS4N_LLAMA_WO,
    DS4N_LLAMA_BQ, DS4N_LLAMA_BK, DS4N_LLAMA_BV, DS4N_LLAMA_BO, /* optional biases */
    DS4N_LLAMA_FFN_NORM, DS4N_LLAMA_W_GATE, DS4N_LLAMA_W_UP, DS4N_LLAMA_W_DOWN,
    DS4N_LLAMA_Q_NORM, DS4N_LLAMA_K_NORM, /* optional per-head RMSNorm of q and k (Qwen 3) */
    DS4N_LLAMA_N_PER_LAYER
};

typedef struct ds4n_llama ds4n_llama;

/* NULL on a shape the engine cannot run (head_dim odd, n_rot > head_dim, ...) or no memory. */
ds4n_llama *ds4n_llama_new(const ds4n_llama_hparams *hp, const void *const *tensors,
                           const int32_t *types);
void ds4n_llama_free(ds4n_llama *model);

/* A session of this model (the ds4n_dec_session_* functions of decoder.h serve it). */
ds4n_dec_session *ds4n_llama_session_new(const ds4n_llama *model, int64_t n_ctx,
                                         int kv_type);

/* Appends n tokens at position n_past: runs the forward pass, stores their K/V, advances
 * n_past. logits receives n_vocab floats for the last token, or n*n_vocab (one row per
 * token) when all_logits; logits may be NULL. Returns DS4N_OK or a DS4N_ERR_* of
 * decoder.h; on an error nothing changes. */
int ds4n_llama_eval(const ds4n_llama *model, ds4n_dec_session *sess, ds4n_pool *pool,
                    const int32_t *tokens, int64_t n, float *logits, int all_logits);

/* Appends counts[i] >= 1 tokens to each of n_seq distinct sessions in one forward pass
 * (the weights read once for all of them; tokens holds each session's tokens in turn).
 * logits (n_seq x n_vocab, may be NULL) receives each session's logits after its last
 * token, bitwise what ds4n_llama_eval of that session alone gives. DS4N_OK, or a
 * DS4N_ERR_* of decoder.h with no session changed. */
int ds4n_llama_eval_batch(const ds4n_llama *model, ds4n_pool *pool,
                          ds4n_dec_session *const *sessions, const int32_t *tokens,
                          const int64_t *counts, int n_seq, float *logits);

#ifdef __cplusplus
}
#endif
#endif
