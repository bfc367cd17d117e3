/* The BERT encoder forward pass (bge, all-MiniLM, ...: GGUF architecture "bert"), composed
 * of the shared decoder pieces (decoder.h, decoder_model.h): the token, token-type (type 0)
 * and learned position embeddings summed and LayerNorm'd, then per layer bidirectional
 * multi-head attention with biases (no rotation), residual and LayerNorm (post-norm), a
 * GELU FFN with biases, residual and LayerNorm. The last layer's rows are the hidden
 * states (no output norm). Used through ds4n_dec_model_embed; its sessions are throwaway.
 */
#ifndef DS4N_BERT_H
#define DS4N_BERT_H

#include <stdint.h>

#include "decoder_model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ds4n_bert_hparams {
    ds4n_dec_shape shape; /* rms_eps carries the LayerNorm epsilon; n_head_kv == n_head */
    int32_t n_pos;        /* rows of the position embedding: positions must be below it */
    int32_t n_token_types; /* rows of the token-type embedding (>= 1; type 0 is used) */
} ds4n_bert_hparams;

/* Weight slots: DS4N_BERT_N_GLOBAL entries (decoder_model.h's three, the output norm and
 * head absent, then this family's), then DS4N_BERT_N_PER_LAYER per layer. Matrices any
 * supported type; the embeddings of positions and token types any type
 * ds4n_dequantize reads; norms and biases F32. */
enum {
    DS4N_BERT_TOKEN_TYPES = DS4N_DEC_N_GLOBAL, /* n_embd x n_token_types */
    DS4N_BERT_POS_EMBD,                        /* n_embd x n_pos */
    DS4N_BERT_EMBD_NORM, DS4N_BERT_EMBD_NORM_B,
    DS4N_BERT_N_GLOBAL
};
enum {
    DS4N_BERT_WQ, DS4N_BERT_BQ, DS4N_BERT_WK, DS4N_BERT_BK, DS4N_BERT_WV, DS4N_BERT_BV,
    DS4N_BERT_WO, DS4N_BERT_BO, DS4N_BERT_ATTN_NORM, DS4N_BERT_ATTN_NORM_B,
    DS4N_BERT_W_UP, DS4N_BERT_B_UP, DS4N_BERT_W_DOWN, DS4N_BERT_B_DOWN,
    DS4N_BERT_OUT_NORM, DS4N_BERT_OUT_NORM_B,
    DS4N_BERT_N_PER_LAYER
};

/* NULL on a shape the engine cannot run (n_head_kv != n_head, n_pos or n_token_types < 1,
 * no FFN, a missing tensor) or no memory. */
ds4n_dec_model *ds4n_bert_new(const ds4n_bert_hparams *hp, const void *const *tensors,
                              const int32_t *types);

/* nomic-bert (nomic-embed-text v1 / v1.5, GGUF architecture "nomic-bert"): BERT's post-norm
 * encoder with rotary positions instead of a position table and a SwiGLU FFN, no biases:
 * the token embedding plus token type 0 (when the file has the table) LayerNorm'd, then per
 * layer bidirectional attention (NEOX RoPE at shape.rope_base over n_rot dims, a fused or
 * split QKV), residual and LayerNorm, down(silu(gate) * up), residual and LayerNorm. */
typedef struct ds4n_nomic_bert_hparams {
    ds4n_dec_shape shape;  /* rms_eps carries the LayerNorm epsilon; n_head_kv == n_head */
    int32_t n_token_types; /* rows of the token-type embedding; 0: the file has none */
} ds4n_nomic_bert_hparams;

enum {
    DS4N_NOMIC_TOKEN_TYPES = DS4N_DEC_N_GLOBAL, /* n_embd x n_token_types, or absent */
    DS4N_NOMIC_EMBD_NORM, DS4N_NOMIC_EMBD_NORM_B,
    DS4N_NOMIC_N_GLOBAL
};
/* Per layer: WQKV, or WQ, WK and WV (the other slot or slots absent). */
enum {
    DS4N_NOMIC_WQKV, DS4N_NOMIC_WQ, DS4N_NOMIC_WK, DS4N_NOMIC_WV, DS4N_NOMIC_WO,
    DS4N_NOMIC_ATTN_NORM, DS4N_NOMIC_ATTN_NORM_B,
    DS4N_NOMIC_W_GATE, DS4N_NOMIC_W_UP, DS4N_NOMIC_W_DOWN,
    DS4N_NOMIC_OUT_NORM, DS4N_NOMIC_OUT_NORM_B,
    DS4N_NOMIC_N_PER_LAYER
};

/* As ds4n_bert_new (also NULL when a layer has neither a fused nor a split QKV, or both). */
ds4n_dec_model *ds4n_nomic_bert_new(const ds4n_nomic_bert_hparams *hp,
                                    const void *const *tensors, const int32_t *types);

#ifdef __cplusplus
}
#endif
#endif
