/* The gemma3 family (Gemma 3 text): embeddings times sqrt(n_embd); per layer RMSNorm,
 * attention (q/k head norms, NEOX RoPE, the file's query scale), RMSNorm of its output,
 * residual, RMSNorm, GELU-gated FFN, RMSNorm of its output, residual; final logit
 * soft-capping when the file declares it. Layers alternate: in every swa_pattern layers the
 * last is global (full causal attention, rope_base, scaled by rope_scale) and the others local
 * (sliding window, rope_base_local, unscaled). The GGUF converter already folded Gemma's
 * "weight + 1" into every norm weight.
 * EmbeddingGemma (GGUF architecture "gemma-embedding") is the same forward pass with
 * bidirectional attention: every layer sees the whole sequence, a local layer the keys
 * less than `window` positions away on either side (attention.h). */
#ifndef DS4N_GEMMA3_H
#define DS4N_GEMMA3_H

#include <stdint.h>

#include "decoder_model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ds4n_gemma3_hparams {
    ds4n_dec_shape shape;        /* rope_base: of the global layers */
    float rope_scale;            /* global layers: 1 / linear factor */
    float rope_base_local;       /* local (sliding-window) layers */
    float q_scale;               /* multiplies q before attention */
    float softcap;               /* final logits: softcap * tanh(l / softcap); 0: none */
    int32_t window;              /* 0: every layer global */
    int32_t swa_pattern;         /* layer il is local when il % swa_pattern < swa_pattern-1 */
    int32_t bidirectional;       /* 1: not causal (EmbeddingGemma); 0: causal */
} ds4n_gemma3_hparams;

enum { DS4N_GEMMA3_N_GLOBAL = DS4N_DEC_N_GLOBAL };
enum {
    DS4N_GEMMA3_ATTN_NORM, DS4N_GEMMA3_WQ, DS4N_GEMMA3_WK, DS4N_GEMMA3_WV, DS4N_GEMMA3_WO,
    DS4N_GEMMA3_Q_NORM, DS4N_GEMMA3_K_NORM, DS4N_GEMMA3_POST_ATTN_NORM, DS4N_GEMMA3_FFN_NORM,
    DS4N_GEMMA3_W_GATE, DS4N_GEMMA3_W_UP, DS4N_GEMMA3_W_DOWN, DS4N_GEMMA3_POST_FFN_NORM,
    DS4N_GEMMA3_N_PER_LAYER
};

/* As ds4n_llama_new. */
ds4n_dec_model *ds4n_gemma3_new(const ds4n_gemma3_hparams *hp, const void *const *tensors,
                                const int32_t *types);

#ifdef __cplusplus
}
#endif
#endif
