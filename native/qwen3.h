/* The qwen3 family (Qwen 3 dense): llama's layer with a per-head RMSNorm of q and k before
 * NEOX RoPE (rotating the two halves of each head), head_dim independent of n_embd. One C call per prefill chunk
 * or decode token; sessions are decoder.h's ds4n_dec_session. */
#ifndef DS4N_QWEN3_H
#define DS4N_QWEN3_H

#include <stdint.h>

#include "decoder.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ds4n_qwen3_hparams {
    int32_t n_vocab, n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_rot;
    float rms_eps;
    float rope_base, rope_scale; /* rope_scale: 1 / linear or YaRN factor (1: none) */
    float yarn_ext_factor, rope_attn_factor, yarn_beta_fast, yarn_beta_slow;
    int32_t n_ctx_orig;
} ds4n_qwen3_hparams;

/* Weight slots, as llama.h: globals, then per layer. Q_NORM and K_NORM hold head_dim. */
enum { DS4N_QWEN3_TOKEN_EMBD, DS4N_QWEN3_OUTPUT_NORM, DS4N_QWEN3_OUTPUT /* optional: tied */,
       DS4N_QWEN3_N_GLOBAL };
enum {
    DS4N_QWEN3_ATTN_NORM, DS4N_QWEN3_WQ, DS4N_QWEN3_WK, DS4N_QWEN3_WV, DS4N_QWEN3_WO,
    DS4N_QWEN3_Q_NORM, DS4N_QWEN3_K_NORM, DS4N_QWEN3_FFN_NORM, DS4N_QWEN3_W_GATE,
    DS4N_QWEN3_W_UP, DS4N_QWEN3_W_DOWN, DS4N_QWEN3_N_PER_LAYER
};

typedef struct ds4n_qwen3 ds4n_qwen3;

/* NULL on a shape the engine cannot run or no memory. */
ds4n_qwen3 *ds4n_qwen3_new(const ds4n_qwen3_hparams *hp, const void *const *tensors,
                           const int32_t *types);
void ds4n_qwen3_free(ds4n_qwen3 *model);
ds4n_dec_session *ds4n_qwen3_session_new(const ds4n_qwen3 *model, int64_t n_ctx);
/* As ds4n_llama_eval. */
int ds4n_qwen3_eval(const ds4n_qwen3 *model, ds4n_dec_session *sess, ds4n_pool *pool,
                    const int32_t *tokens, int64_t n, float *logits, int all_logits);

#ifdef __cplusplus
}
#endif
#endif
