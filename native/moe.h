/* Mixture-of-experts FFN, shared by the MoE families: router logits, gating (which experts
 * and with what weights), and the selected experts' gated FFNs.
 *
 * Experts are stored as GGUF 3-D tensors, one expert after the other: gate and up as
 * [n_expert][n_ff][n_embd], down as [n_expert][n_embd][n_ff], any quant type the kernels
 * run. Only the selected experts' weights are read: a decode token reads n_used experts; a
 * prefill chunk groups its tokens by expert, so each expert used by the chunk is read once
 * (a matrix-matrix product over that expert's gathered rows).
 */
#ifndef DS4N_MOE_H
#define DS4N_MOE_H

#include <stdint.h>

#include "ds4n.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Gating functions, numbered as GGUF's `expert_gating_func`:
 * SOFTMAX: softmax over all experts, top-k of the probabilities, weights = those probabilities;
 * SIGMOID: the same with a sigmoid per expert;
 * SOFTMAX_WEIGHT: top-k of the logits, weights = softmax over the selected logits. */
enum { DS4N_MOE_SOFTMAX = 1, DS4N_MOE_SIGMOID = 2, DS4N_MOE_SOFTMAX_WEIGHT = 3 };

/* Expert activations of gate g and up u (after their biases):
 * SWIGLU: silu(g) * u;
 * SWIGLU_OAI: g' = min(g, limit), u' = clamp(u, -limit, limit), g' * sigmoid(alpha * g') * (u' + 1). */
enum { DS4N_MOE_SWIGLU = 0, DS4N_MOE_SWIGLU_OAI = 1 };

typedef struct ds4n_moe {
    int32_t n_expert, n_used, n_embd, n_ff;
    int32_t gating, activation;
    int32_t norm_weights;  /* nonzero: selected weights divided by their sum */
    float weights_scale;   /* multiplies the final weights; 0 or 1 mean none */
    float oai_alpha, oai_limit;
    const void *router;    /* n_expert rows of n_embd */
    int32_t router_type;
    const float *router_bias;                      /* n_expert; optional */
    const void *gate, *up, *down;
    int32_t gate_type, up_type, down_type;
    const float *gate_bias, *up_bias, *down_bias;  /* [n_expert][n_ff] x2, [n_expert][n_embd]; optional */
} ds4n_moe;

/* 1 when the description is one this piece can run (sizes positive, n_used <= n_expert,
 * supported types, row lengths whole blocks, known gating and activation, weights present). */
int ds4n_moe_valid(const ds4n_moe *moe);

enum { DS4N_MOE_OK = 0, DS4N_MOE_ERR_NO_MEMORY = -1, DS4N_MOE_ERR_BAD_EXPERT = -2 };

/* What a family's eval returns for a routing failure, beside decoder.h's DS4N_ERR_*. */
#define DS4N_ERR_BAD_EXPERT (-4)

/* Gating alone: T rows of n_expert router logits (router bias already added) to
 * T x n_used expert ids (best first; ties to the lower id; NaN ranks lowest) and weights.
 * DS4N_MOE_OK, or DS4N_MOE_ERR_NO_MEMORY. */
int ds4n_moe_route(const ds4n_moe *moe, const float *logits, int64_t T, int32_t *ids,
                   float *weights);

/* Per-session working memory (grown on demand) and the expert-read counter. */
typedef struct ds4n_moe_scratch ds4n_moe_scratch;
ds4n_moe_scratch *ds4n_moe_scratch_new(void);
void ds4n_moe_scratch_free(ds4n_moe_scratch *s);
/* Bytes of expert weights (matrices and biases of the selected experts) handed to the
 * kernels by ds4n_moe_forward calls on this scratch so far. The router is not counted. */
int64_t ds4n_moe_expert_bytes(const ds4n_moe_scratch *s);

/* Makes room for calls of up to T tokens of moe (forward does it too; a caller that must not
 * fail half-way reserves first). 0, or DS4N_MOE_ERR_NO_MEMORY. */
int ds4n_moe_scratch_reserve(ds4n_moe_scratch *s, const ds4n_moe *moe, int64_t T);

/* out (T x n_embd) = the MoE FFN of x (T x n_embd): sum over each token's selected experts of
 * weight * expert(x). The residual is not added. moe must be ds4n_moe_valid. Work is split
 * across the pool (may be NULL); calls sharing a pool or scratch must not overlap. */
int ds4n_moe_forward(ds4n_pool *pool, const ds4n_moe *moe, ds4n_moe_scratch *s, const float *x,
                     int64_t T, float *out);

/* The same over the concatenated rows of n_seq sequences of count[i] >= 1 tokens each (a
 * batch of sessions): every row gets bitwise what it gets when its sequence is passed
 * alone, while each expert's weights are read once for all the rows that chose it. */
int ds4n_moe_forward_batch(ds4n_pool *pool, const ds4n_moe *moe, ds4n_moe_scratch *s,
                           const float *x, const int64_t *count, int n_seq, float *out);

#ifdef __cplusplus
}
#endif
#endif
