/* The qwen2 family (Qwen 2 / 2.5, Qwen2.5-Coder): llama's layer with q/k/v projection
 * biases and NEOX RoPE (rotating the two halves of each head). One C call per prefill chunk
 * or decode token; sessions are decoder.h's ds4n_dec_session. */
#ifndef DS4N_QWEN2_H
#define DS4N_QWEN2_H

#include <stdint.h>

#include "decoder.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ds4n_qwen2_hparams {
    int32_t n_vocab, n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_rot;
    float rms_eps;
    float rope_base, rope_scale; /* rope_scale: 1 / linear or YaRN factor (1: none) */
    float yarn_ext_factor, rope_attn_factor, yarn_beta_fast, yarn_beta_slow;
    int32_t n_ctx_orig;
} ds4n_qwen2_hparams;

/* Weight slots, as llama.h: globals, then per layer. Biases are required by the format
 * but any may be NULL (absent). */
enum { DS4N_QWEN2_TOKEN_EMBD, DS4N_QWEN2_OUTPUT_NORM, DS4N_QWEN2_OUTPUT /* optional: tied */,
       DS4N_QWEN2_N_GLOBAL };
enum {
    DS4N_QWEN2_ATTN_NORM, DS4N_QWEN2_WQ, DS4N_QWEN2_WK, DS4N_QWEN2_WV, DS4N_QWEN2_WO,
    DS4N_QWEN2_BQ, DS4N_QWEN2_BK, DS4N_QWEN2_BV, DS4N_QWEN2_FFN_NORM, DS4N_QWEN2_W_GATE,
    DS4N_QWEN2_W_UP, DS4N_QWEN2_W_DOWN, DS4N_QWEN2_N_PER_LAYER
};

typedef struct ds4n_qwen2 ds4n_qwen2;

/* NULL on a shape the engine cannot run or no memory. */
ds4n_qwen2 *ds4n_qwen2_new(const ds4n_qwen2_hparams *hp, const void *const *tensors,
                           const int32_t *types);
void ds4n_qwen2_free(ds4n_qwen2 *model);
ds4n_dec_session *ds4n_qwen2_session_new(const ds4n_qwen2 *model, int64_t n_ctx);
/* As ds4n_llama_eval. */
int ds4n_qwen2_eval(const ds4n_qwen2 *model, ds4n_dec_session *sess, ds4n_pool *pool,
                    const int32_t *tokens, int64_t n, float *logits, int all_logits);

#ifdef __cplusplus
}
#endif
#endif
