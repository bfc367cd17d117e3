/* deepseek4 — the DeepSeek V4 Flash forward pass (ds4's model), over mmapped GGUF weights.
 *
 * One ds4n_dsv4_eval call runs a whole chunk of tokens (a prefill chunk, or one decode
 * token) through every layer: matmuls are batched over the chunk layer by layer, while
 * the cache updates (raw window, compressors, indexer) and the attention run token by
 * token inside each layer, so a chunk is mathematically the same as single steps.
 *
 * The session state lives here in C; ds4n_dsv4_state_layer exposes its buffers so that the
 * Python side can save and restore it (the "DSV4" payload) without copies in C.
 * deepseek4.c names each step of the math where it is computed.
 */
#ifndef DS4N_DEEPSEEK4_H
#define DS4N_DEEPSEEK4_H

#include <stdint.h>

#include "ds4n.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Hyper-parameters, read from the GGUF by Python (shapes scale down in synthetic files). */
typedef struct {
    int32_t n_layer, n_embd, n_vocab, n_head, head_dim, n_rot;
    int32_t q_lora_rank, o_lora_rank, o_groups;
    int32_t n_expert, n_expert_used, n_ff_exp, n_hash_layer;
    int32_t window, idx_n_head, idx_head_dim, idx_top_k;
    int32_t n_hc, sinkhorn_iters, rope_orig_ctx;
    float hc_eps, rms_eps, swiglu_clamp;
    float rope_base, compress_rope_base, rope_scale, yarn_beta_fast, yarn_beta_slow;
    float expert_weight_scale;
} ds4n_dsv4_params;

/* Global tensors (set with il = -1). */
enum {
    DSV4_TOKEN_EMBD, DSV4_OUT_HC_BASE, DSV4_OUT_HC_FN, DSV4_OUT_HC_SCALE, DSV4_OUT_NORM,
    DSV4_OUTPUT, DSV4_N_GLOBAL
};
/* Per-layer tensors. */
enum {
    DSV4_HC_ATTN_FN, DSV4_HC_ATTN_SCALE, DSV4_HC_ATTN_BASE, DSV4_ATTN_NORM,
    DSV4_Q_A, DSV4_Q_A_NORM, DSV4_Q_B, DSV4_KV, DSV4_KV_NORM, DSV4_SINKS,
    DSV4_OUT_A, DSV4_OUT_B,
    DSV4_CMP_APE, DSV4_CMP_KV, DSV4_CMP_GATE, DSV4_CMP_NORM,
    DSV4_IDX_Q_B, DSV4_IDX_PROJ, DSV4_IDX_CMP_APE, DSV4_IDX_CMP_KV, DSV4_IDX_CMP_GATE,
    DSV4_IDX_CMP_NORM,
    DSV4_HC_FFN_FN, DSV4_HC_FFN_SCALE, DSV4_HC_FFN_BASE, DSV4_FFN_NORM,
    DSV4_GATE_INP, DSV4_EXP_BIAS, DSV4_GATE_EXPS, DSV4_UP_EXPS, DSV4_DOWN_EXPS,
    DSV4_GATE_SH, DSV4_UP_SH, DSV4_DOWN_SH, DSV4_TID2EID,
    DSV4_N_LAYER_SLOT
};

/* Return codes of every int-returning entry point (0 is success). The Python side maps
 * each to its message (ds4d/engine/deepseek4.py ERRORS); -1..-4 mean what they mean for
 * the other families (decoder.h, moe). */
enum {
    DSV4_OK = 0,
    DSV4_ERR_CONTEXT = -1,   /* the tokens would overflow the session's context */
    DSV4_ERR_TOKEN = -2,     /* a token id outside the vocabulary */
    DSV4_ERR_NOMEM = -3,     /* out of memory */
    DSV4_ERR_EXPERT = -4,    /* the hash-routing table names an expert outside 0..n_expert-1 */
    DSV4_ERR_UNBOUND = -5,   /* a tensor the forward needs is not bound */
    DSV4_ERR_TENSOR = -6,    /* a tensor's type or byte length does not fit its slot */
    DSV4_ERR_ARG = -7,       /* a bad argument: null pointer, index, length or count */
};

/* Most tokens one eval call takes (bounds every scratch size it computes). */
#define DSV4_MAX_CHUNK 65536

typedef struct ds4n_dsv4_model ds4n_dsv4_model;
typedef struct ds4n_dsv4_state ds4n_dsv4_state;

/* ratios: n_ratios (== p->n_layer) compression ratios (0, 4 or 128). NULL on a bad
 * parameter set (a dimension out of range, ratios of the wrong count or value). */
ds4n_dsv4_model *ds4n_dsv4_model_new(const ds4n_dsv4_params *p, const int32_t *ratios,
                                     int64_t n_ratios);
void ds4n_dsv4_model_free(ds4n_dsv4_model *m);
/* Binds one tensor: a pointer into the mmap of n_bytes bytes, of GGML type `type`.
 * The slot fixes the shape the parameters imply; a type the slot cannot use or a length
 * other than that shape's bytes is DSV4_ERR_TENSOR, a bad layer/slot DSV4_ERR_ARG. */
int ds4n_dsv4_set_tensor(ds4n_dsv4_model *m, int il, int slot, const void *data, int type,
                         int64_t n_bytes);

/* A state belongs to its model: every call on it needs the model alive, except
 * ds4n_dsv4_state_free, which may come after ds4n_dsv4_model_free. */
ds4n_dsv4_state *ds4n_dsv4_state_new(const ds4n_dsv4_model *m, int64_t n_ctx);
void ds4n_dsv4_state_free(ds4n_dsv4_state *st);
void ds4n_dsv4_state_reset(ds4n_dsv4_state *st);   /* empty: no tokens, fresh frontiers */
int64_t ds4n_dsv4_state_pos(const ds4n_dsv4_state *st);
/* Attaches steering (steer.h; NULL detaches; kept alive by the caller while attached),
 * applied to each sublayer's output before the hyper-connection mix. 0, or -1 when it is
 * of another n_embd or layer count. The capture rows are then each layer's FFN output. */
struct ds4n_steer;
int ds4n_dsv4_state_set_steer(ds4n_dsv4_state *st, struct ds4n_steer *s);

/* The buffers of one layer. raw is a ring of raw_cap rows: the row of position p sits at
 * p % raw_cap. Frontier tensors are rows x width (0 x 0 when the layer has none). */
typedef struct {
    float *raw, *comp, *icomp;
    float *attn_kv, *attn_score, *idx_kv, *idx_score;
    int64_t raw_cap, comp_cap, n_comp, n_icomp;
    int64_t attn_rows, attn_width, idx_rows, idx_width;
    int32_t ratio, head_dim, idx_head_dim;
} ds4n_dsv4_layer_state;

/* Returns 0, or DSV4_ERR_ARG for a layer index out of range. */
int ds4n_dsv4_state_layer(ds4n_dsv4_state *st, int il, ds4n_dsv4_layer_state *out);
/* After writing the buffers: set the position and the per-layer row counts (n_layers
 * entries each, == the model's n_layer). Returns 0, or DSV4_ERR_ARG when a count exceeds
 * its capacity or the lengths do not match (state untouched). */
int ds4n_dsv4_state_restore(ds4n_dsv4_state *st, int64_t n_pos, const int64_t *n_comp,
                            const int64_t *n_icomp, int64_t n_layers);

/* Runs tokens[0..n) at positions pos..pos+n, n <= DSV4_MAX_CHUNK. When logits is not
 * NULL it receives the logits after the last token (n_vocab floats), or after every token
 * (n x n_vocab) when all_logits is set; n_logits is its length in floats and must hold
 * that. Returns 0 or a DSV4_ERR_* code; on any error the state is untouched (every input,
 * the routing-table entries the tokens select included, is checked before the state
 * changes). */
int ds4n_dsv4_eval(const ds4n_dsv4_model *m, ds4n_dsv4_state *st, ds4n_pool *pool,
                   const int32_t *tokens, int64_t n, float *logits, int64_t n_logits,
                   int all_logits);

#ifdef __cplusplus
}
#endif
#endif
