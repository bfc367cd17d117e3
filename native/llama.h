/* The llama-family forward pass: one C call evaluates a whole prefill chunk or one decode
 * token (embedding, every layer, final norm, output head) against a session's KV cache.
 *
 * The model borrows the weight pointers (the GGUF mmap, kept alive by the caller) and
 * copies nothing. A session (decoder.h) owns its KV cache (float32, f16 or q8_0: kv_type),
 * sized to its n_ctx, in C memory (zero pages until touched). Calls on the same model and
 * pool must not overlap; the functions never touch Python objects.
 */
#ifndef DS4N_LLAMA_H
#define DS4N_LLAMA_H

#include <stdint.h>

#include "decoder_model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ds4n_llama_hparams {
    ds4n_dec_shape shape;
    ds4n_dec_rope_scaling scaling;
    /* RoPE pairs: 0 llama.cpp's NORMAL (adjacent values, llama), 1 NEOX (the two halves of
     * the rotated dims, Qwen 2/3). */
    int32_t rope_neox;
} ds4n_llama_hparams;

/* Weight slots: tensors[] and types[] hold DS4N_LLAMA_N_GLOBAL entries (decoder_model.h's
 * three, then this family's), then DS4N_LLAMA_N_PER_LAYER entries per layer. Absent
 * optional tensors are NULL. Norm weights, biases and rope factors are F32; matrices any
 * supported type, GGUF layout (rows of ne0 = input width). */
enum {
    DS4N_LLAMA_ROPE_FREQS = DS4N_DEC_N_GLOBAL, /* optional: n_rot/2 frequency factors */
    DS4N_LLAMA_N_GLOBAL
};
enum {
    DS4N_LLAMA_ATTN_NORM, DS4N_LLAMA_WQ, DS4N_LLAMA_WK, DS4N_LLAMA_WV, DS4N_LLAMA_WO,
    DS4N_LLAMA_BQ, DS4N_LLAMA_BK, DS4N_LLAMA_BV, DS4N_LLAMA_BO, /* optional biases */
    DS4N_LLAMA_FFN_NORM, DS4N_LLAMA_W_GATE, DS4N_LLAMA_W_UP, DS4N_LLAMA_W_DOWN,
    DS4N_LLAMA_Q_NORM, DS4N_LLAMA_K_NORM, /* optional per-head RMSNorm of q and k (Qwen 3) */
    DS4N_LLAMA_N_PER_LAYER
};

/* NULL on a shape the engine cannot run (head_dim odd, n_rot > head_dim, ...) or no memory.
 * The model is freed, and its sessions made and evaluated, by decoder_model.h's
 * ds4n_dec_model_* functions. */
ds4n_dec_model *ds4n_llama_new(const ds4n_llama_hparams *hp, const void *const *tensors,
                               const int32_t *types);

#ifdef __cplusplus
}
#endif
#endif
