/* The phi3 family (Phi-3, Phi-3.5, Phi-4 mini): llama's layer with a fused QKV projection
 * (rows Q, K, V) and a fused gate-up tensor (rows gate then up), NEOX RoPE with optional
 * long/short frequency factors (the long ones when a session's context exceeds n_ctx_orig,
 * as llama.cpp chooses) and the file's attention factor on cos/sin, and an optional sliding
 * window on every layer. */
#ifndef DS4N_PHI3_H
#define DS4N_PHI3_H

#include <stdint.h>

#include "decoder_model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ds4n_phi3_hparams {
    ds4n_dec_shape shape;
    ds4n_dec_rope_scaling scaling; /* contexts above its n_ctx_orig take the long factors */
    int32_t window;                /* 0: full causal attention */
} ds4n_phi3_hparams;

enum { DS4N_PHI3_ROPE_LONG = DS4N_DEC_N_GLOBAL,
       DS4N_PHI3_ROPE_SHORT /* optional (both or neither), n_rot/2 each */, DS4N_PHI3_N_GLOBAL };
enum {
    DS4N_PHI3_ATTN_NORM, DS4N_PHI3_WQKV, DS4N_PHI3_WO, DS4N_PHI3_FFN_NORM, DS4N_PHI3_W_UP,
    DS4N_PHI3_W_DOWN, DS4N_PHI3_N_PER_LAYER
};

/* As ds4n_llama_new. */
ds4n_dec_model *ds4n_phi3_new(const ds4n_phi3_hparams *hp, const void *const *tensors,
                              const int32_t *types);

#ifdef __cplusplus
}
#endif
#endif
