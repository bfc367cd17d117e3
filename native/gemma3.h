/* The gemma3 family (Gemma 3 text): embeddings times sqrt(n_embd); per layer RMSNorm,
 * attention (q/k head norms, NEOX RoPE, the file's query scale), RMSNorm of its output,
 * residual, RMSNorm, GELU-gated FFN, RMSNorm of its output, residual; final logit
 * soft-capping when the file declares it. Layers alternate: in every swa_pattern layers the
 * last is global (full causal attention, rope_base, scaled by rope_scale) and the others local
 * (sliding window, rope_base_local, unscaled). The GGUF converter already folded Gemma's
 * "weight + 1" into every norm weight. Sessions are decoder.h's ds4n_dec_session. */
#ifndef DS4N_GEMMA3_H
#define DS4N_GEMMA3_H

#include <stdint.h>

#include "decoder.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ds4n_gemma3_hparams {
    int32_t n_vocab, n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_rot;
    float rms_eps;
    float rope_base, rope_scale; /* global layers; rope_scale: 1 / linear factor */
    float rope_base_local;       /* local (sliding-window) layers */
    float q_scale;               /* multiplies q before attention */
    float softcap;               /* final logits: softcap * tanh(l / softcap); 0: none */
    int32_t window;              /* 0: every layer global */
    int32_t swa_pattern;         /* layer il is local when il % swa_pattern < swa_pattern-1 */
} ds4n_gemma3_hparams;

enum { DS4N_GEMMA3_TOKEN_EMBD, DS4N_GEMMA3_OUTPUT_NORM, DS4N_GEMMA3_OUTPUT /* optional */,
       DS4N_GEMMA3_N_GLOBAL };
enum {
    DS4N_GEMMA3_ATTN_NORM, DS4N_GEMMA3_WQ, DS4N_GEMMA3_WK, DS4N_GEMMA3_WV, DS4N_GEMMA3_WO,
    DS4N_GEMMA3_Q_NORM, DS4N_GEMMA3_K_NORM, DS4N_GEMMA3_POST_ATTN_NORM, DS4N_GEMMA3_FFN_NORM,
    DS4N_GEMMA3_W_GATE, DS4N_GEMMA3_W_UP, DS4N_GEMMA3_W_DOWN, DS4N_GEMMA3_POST_FFN_NORM,
    DS4N_GEMMA3_N_PER_LAYER
};

typedef struct ds4n_gemma3 ds4n_gemma3;

ds4n_gemma3 *ds4n_gemma3_new(const ds4n_gemma3_hparams *hp, const void *const *tensors,
                             const int32_t *types);
void ds4n_gemma3_free(ds4n_gemma3 *model);
ds4n_dec_session *ds4n_gemma3_session_new(const ds4n_gemma3 *model, int64_t n_ctx,
                                          int kv_type);
/* As ds4n_llama_eval. */
int ds4n_gemma3_eval(const ds4n_gemma3 *model, ds4n_dec_session *sess, ds4n_pool *pool,
                     const int32_t *tokens, int64_t n, float *logits, int all_logits);

/* Appends counts[i] >= 1 tokens to each of n_seq distinct sessions in one forward pass
 * (the weights read once for all of them; tokens holds each session's tokens in turn).
 * logits (n_seq x n_vocab, may be NULL) receives each session's logits after its last
 * token, bitwise what ds4n_gemma3_eval of that session alone gives. DS4N_OK, or a
 * DS4N_ERR_* of decoder.h with no session changed. */
int ds4n_gemma3_eval_batch(const ds4n_gemma3 *model, ds4n_pool *pool,
                           ds4n_dec_session *const *sessions, const int32_t *tokens,
                           const int64_t *counts, int n_seq, float *logits);

#ifdef __cplusplus
}
#endif
#endif
