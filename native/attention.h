/* Causal grouped-query attention over a float32 KV cache, one job at a time.
 *
 * A job is one kv head, a block of consecutive query tokens, and a range of key positions.
 * The query heads that share the kv head are processed together (their rows are adjacent
 * in memory), so every K and V value loaded from the cache serves all of them. Keys are
 * visited in blocks with an online softmax (running max, running sum, rescaled output),
 * accumulated in float32 after max-subtraction. A job may restrict each query to a sliding
 * window of keys and add per-head sink logits to the softmax denominator.
 *
 * Cache layout of one (layer, kv head):
 *   K: tiles of DS4N_KT positions, each tile [head_dim][DS4N_KT] (positions innermost), so a
 *      query-times-keys product is a plain broadcast-and-FMA over contiguous key lanes;
 *   V: rows [position][head_dim].
 */
#ifndef DS4N_ATTENTION_H
#define DS4N_ATTENTION_H

#include <stdint.h>

#define DS4N_KT 16       /* positions per K tile */
#define DS4N_KBLOCK 64   /* keys per online-softmax step (a multiple of DS4N_KT) */

typedef struct ds4n_attn_job {
    const float *q;    /* row (t, g) at q + t*q_stride + g*head_dim, pre-scaled by 1/sqrt(hd) */
    int64_t q_stride;
    float *o;          /* output rows, same addressing with o_stride */
    int64_t o_stride;
    int n_tok;         /* query tokens */
    int n_group;       /* query heads sharing this kv head */
    int head_dim;
    int64_t pos0;      /* absolute position of the first query token */
    const float *k;    /* K tiles of this (layer, kv head) */
    const float *v;    /* V rows of this (layer, kv head) */
    int64_t k0, k1;    /* keys visited: [k0, min(k1, pos+1)) for a query at position pos */
    int64_t window;    /* > 0: a sliding window, keys [pos-window+1, pos] only; 0: all */
    /* Optional attention sinks: sinks[g] is an extra logit of query head g in the softmax
     * denominator (no value). Applied only when the job normalizes (m == NULL); a split-key
     * caller adds it when it merges the partials. */
    const float *sinks;
    /* Split-key mode when non-NULL: o receives the unnormalized sum and m / l (one per row
     * r = t*n_group + g) the running max and sum, for ds4n_attn_merge. */
    float *m, *l;
} ds4n_attn_job;

/* The factor that turns an unnormalized output row (running max m, running sum l) into
 * the softmax average: 1/l, or with a sink logit 1/(l + exp(sink - m)), computed without
 * overflow. 0 when no key was visited. */
float ds4n_attn_norm_factor(float m, float l, const float *sink);

/* Floats of scratch a job with n_rows = n_tok*n_group query rows needs. */
int64_t ds4n_attn_scratch_floats(int n_rows, int head_dim);

/* Runs a job with the best kernel set in force (ds4n_simd_level()). */
void ds4n_attn_run(const ds4n_attn_job *job, float *scratch);

void ds4n_attn_scalar(const ds4n_attn_job *job, float *scratch);
#if defined(__x86_64__) || defined(_M_X64)
void ds4n_attn_avx2(const ds4n_attn_job *job, float *scratch);
#endif
#if defined(__aarch64__)
void ds4n_attn_neon(const ds4n_attn_job *job, float *scratch);
#endif

/* g[i] = silu(g[i]) * u[i] (the SwiGLU gate), with the best kernel set in force. */
void ds4n_swiglu(float *g, const float *u, int64_t n);
void ds4n_swiglu_scalar(float *g, const float *u, int64_t n);
#if defined(__x86_64__) || defined(_M_X64)
void ds4n_swiglu_avx2(float *g, const float *u, int64_t n);
#endif
#if defined(__aarch64__)
void ds4n_swiglu_neon(float *g, const float *u, int64_t n);
#endif


/* g[i] = gelu(g[i]) * u[i] with GELU's tanh approximation (the GeGLU gate), with the best
 * kernel set in force. */
void ds4n_geglu(float *g, const float *u, int64_t n);
void ds4n_geglu_scalar(float *g, const float *u, int64_t n);
#if defined(__x86_64__) || defined(_M_X64)
void ds4n_geglu_avx2(float *g, const float *u, int64_t n);
#endif
#if defined(__aarch64__)
void ds4n_geglu_neon(float *g, const float *u, int64_t n);
#endif

#endif
