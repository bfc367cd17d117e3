/* The phi3 family (Phi-3, Phi-3.5, Phi-4 mini): llama's layer with a fused QKV projection
 * (rows Q, K, V) and a fused gate-up tensor (rows gate then up), NEOX RoPE with optional
 * long/short frequency factors (the long ones when a session's context exceeds n_ctx_orig,
 * as llama.cpp chooses) and the file's attention factor on cos/sin, and an optional sliding
 * window on every layer. Sessions are decoder.h's ds4n_dec_session. */
#ifndef DS4N_PHI3_H
#define DS4N_PHI3_H

#include <stdint.h>

#include "decoder.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ds4n_phi3_hparams {
    int32_t n_vocab, n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_rot;
    float rms_eps;
    float rope_base, rope_scale;
    float rope_attn_factor; /* multiplies cos and sin (0 or 1: none) */
    int32_t n_ctx_orig;     /* contexts above it take the long factors */
    int32_t window;         /* 0: full causal attention */
} ds4n_phi3_hparams;

enum { DS4N_PHI3_TOKEN_EMBD, DS4N_PHI3_OUTPUT_NORM, DS4N_PHI3_OUTPUT /* optional: tied */,
       DS4N_PHI3_ROPE_LONG, DS4N_PHI3_ROPE_SHORT /* optional, n_rot/2 each */,
       DS4N_PHI3_N_GLOBAL };
enum {
    DS4N_PHI3_ATTN_NORM, DS4N_PHI3_WQKV, DS4N_PHI3_WO, DS4N_PHI3_FFN_NORM, DS4N_PHI3_W_UP,
    DS4N_PHI3_W_DOWN, DS4N_PHI3_N_PER_LAYER
};

typedef struct ds4n_phi3 ds4n_phi3;

ds4n_phi3 *ds4n_phi3_new(const ds4n_phi3_hparams *hp, const void *const *tensors,
                         const int32_t *types);
void ds4n_phi3_free(ds4n_phi3 *model);
ds4n_dec_session *ds4n_phi3_session_new(const ds4n_phi3 *model, int64_t n_ctx,
                                        int kv_type);
/* As ds4n_llama_eval. */
int ds4n_phi3_eval(const ds4n_phi3 *model, ds4n_dec_session *sess, ds4n_pool *pool,
                   const int32_t *tokens, int64_t n, float *logits, int all_logits);

/* Appends counts[i] >= 1 tokens to each of n_seq distinct sessions in one forward pass
 * (the weights read once for all of them; tokens holds each session's tokens in turn).
 * logits (n_seq x n_vocab, may be NULL) receives each session's logits after its last
 * token, bitwise what ds4n_phi3_eval of that session alone gives. DS4N_OK, or a
 * DS4N_ERR_* of decoder.h with no session changed. */
int ds4n_phi3_eval_batch(const ds4n_phi3 *model, ds4n_pool *pool,
                         ds4n_dec_session *const *sessions, const int32_t *tokens,
                         const int64_t *counts, int n_seq, float *logits);

#ifdef __cplusplus
}
#endif
#endif
