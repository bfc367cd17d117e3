/* What the model of every attention-decoder family shares (llama.c, phi3.c, gemma3.c, and
 * through moe_decoder.h qwen3moe.c and gptoss.c), so a family's C file holds only what is
 * its own: the hyper-parameters beyond the shape, its RoPE objects and its layer loop.
 *
 *   Shape (ds4n_dec_shape): the hyper-parameters every such family has, the first member of
 *     each family's hparams struct; ds4n_dec_model_init checks it once for all of them.
 *   RoPE scaling (ds4n_dec_rope_scaling): the file's linear / YaRN scaling fields, for the
 *     families that take them as llama.cpp reads them; ds4n_dec_rope_params turns shape and
 *     scaling into decoder.h's ds4n_rope_params.
 *   Model (ds4n_dec_model): the first member of a family's model struct (allocated by
 *     ds4n_dec_model_new; the family's ds4n_<family>_new returns this member): the shape, the decoder dims, the weight table, and the family's layer loop. The loop gets
 *     a begun batch (the embedding rows in b->x) and leaves the last residual rows there;
 *     the embedding before it and the final norm, head and soft-cap after it are shared, as
 *     are freeing the model, its sessions (decoder.h's ds4n_dec_session) and the eval calls.
 *
 * Every family's weight table starts with the three global slots DS4N_DEC_TOKEN_EMBD,
 * DS4N_DEC_OUTPUT_NORM and DS4N_DEC_OUTPUT (an absent output head is tied to the token
 * embedding); its own global slots follow from DS4N_DEC_N_GLOBAL.
 */
#ifndef DS4N_DECODER_MODEL_H
#define DS4N_DECODER_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "decoder.h"
#include "ds4n.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ds4n_dec_shape {
    int32_t n_vocab, n_embd, n_layer, n_head, n_head_kv, head_dim;
    int32_t n_ff; /* the dense FFN's width; 0 in a mixture-of-experts family */
    int32_t n_rot;
    float rms_eps, rope_base;
} ds4n_dec_shape;

typedef struct ds4n_dec_rope_scaling {
    float freq_scale;           /* 1 / linear scaling factor (1 when unscaled) */
    float ext_factor;           /* YaRN when > 0 */
    float attn_factor;          /* multiplies cos and sin (0 or 1: none) */
    float beta_fast, beta_slow; /* YaRN correction range */
    int32_t n_ctx_orig;         /* the training context before scaling */
} ds4n_dec_rope_scaling;

enum { DS4N_DEC_TOKEN_EMBD, DS4N_DEC_OUTPUT_NORM, DS4N_DEC_OUTPUT, DS4N_DEC_N_GLOBAL };

typedef struct ds4n_dec_model ds4n_dec_model;

/* A family's layers over a begun batch: DS4N_OK, or an error with no session's n_past
 * changed (the K/V rows already written are then not held). */
typedef int (*ds4n_dec_layers_fn)(const ds4n_dec_model *m, ds4n_dec_batch *b, ds4n_pool *pool);

struct ds4n_dec_model {
    ds4n_dec_shape shape;
    ds4n_dec_dims dims;
    ds4n_dec_weights wt;
    float embd_scale; /* multiplies the embedding rows (1: none) */
    float softcap;    /* final logits: softcap * tanh(l / softcap); 0: none */
    int bidirectional; /* attention is not causal (an encoder, or a decoder run as one) */
    ds4n_dec_layers_fn layers;
    void (*release)(ds4n_dec_model *m); /* frees the family's own parts; NULL: none */
};

/* A zeroed allocation of size bytes (the family's model struct, whose first member is a
 * ds4n_dec_model) with that member set up: the shape checked (positive sizes, n_head a
 * multiple of n_head_kv, 0 < n_rot <= head_dim, n_ff >= 0), the dims set from it, the weight
 * tables copied (n_global + n_layer * n_per_layer entries), embd_scale 1, softcap 0, the
 * layer loop. NULL on a bad shape or count or no memory. */
void *ds4n_dec_model_new(size_t size, const ds4n_dec_shape *shape, int n_global,
                         int n_per_layer, const void *const *tensors, const int32_t *types,
                         ds4n_dec_layers_fn layers);

/* The rotation of the shape's first n_rot dims at its rope_base, in mode, with the file's
 * scaling (NULL: none) and n_rot/2 frequency factors (NULL: none). */
ds4n_rope_params ds4n_dec_rope_params(const ds4n_dec_shape *shape, int mode,
                                      const ds4n_dec_rope_scaling *scaling,
                                      const float *freq_factors);

/* The model's release, its weight table, then the model itself (NULL: nothing). */
void ds4n_dec_model_free(ds4n_dec_model *m);

/* A session of this model (the ds4n_dec_session_* functions of decoder.h serve it). */
ds4n_dec_session *ds4n_dec_model_session_new(const ds4n_dec_model *m, int64_t n_ctx,
                                             int kv_type);

/* Appends n tokens at position n_past: runs the forward pass, stores their K/V, advances
 * n_past. logits receives n_vocab floats for the last token, or n*n_vocab (one row per
 * token) when all_logits; logits may be NULL. Returns DS4N_OK or a DS4N_ERR_* of
 * decoder.h (or moe.h's DS4N_ERR_BAD_EXPERT); on an error nothing changes. */
int ds4n_dec_model_eval(const ds4n_dec_model *m, ds4n_dec_session *sess, ds4n_pool *pool,
                        const int32_t *tokens, int64_t n, float *logits, int all_logits);

/* Appends counts[i] >= 1 tokens to each of n_seq distinct sessions in one forward pass
 * (the weights read once for all of them; tokens holds each session's tokens in turn).
 * logits (n_seq x n_vocab, may be NULL) receives each session's logits after its last
 * token, bitwise what ds4n_dec_model_eval of that session alone gives. DS4N_OK, or an
 * error as ds4n_dec_model_eval's with no session changed. */
int ds4n_dec_model_eval_batch(const ds4n_dec_model *m, ds4n_pool *pool,
                              ds4n_dec_session *const *sessions, const int32_t *tokens,
                              const int64_t *counts, int n_seq, float *logits);

/* ds4n_dec_model_eval_batch, with the logits of each session's last n_logits[i] new rows
 * (1 <= n_logits[i] <= counts[i]) one session after the other in logits (sum of n_logits
 * x n_vocab, not NULL): a session of at most DS4N_DEC_SMALL_T new rows gets every row
 * bitwise what ds4n_dec_model_eval of it alone gives with all_logits (a verification chunk
 * of speculative decoding beside other sessions' decode steps). DS4N_ERR_BAD_BATCH for a
 * count of rows outside that range; else as ds4n_dec_model_eval_batch. */
int ds4n_dec_model_eval_rows(const ds4n_dec_model *m, ds4n_pool *pool,
                             ds4n_dec_session *const *sessions, const int32_t *tokens,
                             const int64_t *counts, int n_seq, const int64_t *n_logits,
                             float *logits);

/* The embedding path: one forward pass over n_seq distinct sessions as
 * ds4n_dec_model_eval_batch's, writing no logits but every new row's final hidden state to
 * hidden (n_rows x n_embd, n_rows the sum of counts): the output norm's RMSNorm when the
 * model has one, else the last layer's rows as they are. Each row is bitwise what it is
 * when its session is evaluated alone. The sessions' n_past advance (a caller that keeps
 * no KV frees them). DS4N_OK, or an error as ds4n_dec_model_eval's with no session
 * changed. */
int ds4n_dec_model_embed(const ds4n_dec_model *m, ds4n_pool *pool,
                         ds4n_dec_session *const *sessions, const int32_t *tokens,
                         const int64_t *counts, int n_seq, float *hidden);

/* 1 when the model's attention is not causal, else 0. */
int ds4n_dec_model_bidirectional(const ds4n_dec_model *m);

#ifdef __cplusplus
}
#endif
#endif
