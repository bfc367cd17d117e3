/* Causal grouped-query attention over a KV cache of float32, IEEE half or Q8_0, one job at
 * a time.
 *
 * A job is one kv head, a block of consecutive query tokens, and a range of key positions.
 * The query heads that share the kv head are processed together (their rows are adjacent
 * in memory), so every K and V value loaded from the cache serves all of them. Keys are
 * visited in blocks with an online softmax (running max, running sum, rescaled output),
 * accumulated in float32 after max-subtraction. A job may restrict each query to a sliding
 * window of keys and add per-head sink logits to the softmax denominator.
 *
 * Cache layout of one (layer, kv head), by element type (DS4N_KV_*):
 *   K: tiles of DS4N_KT positions (positions innermost), so a query-times-keys product is a
 *      plain broadcast-and-FMA over contiguous key lanes:
 *        f32, f16: [head_dim][DS4N_KT] values;
 *        q8_0:     per block of 32 dims, [DS4N_KT] half scales then [32][DS4N_KT] int8.
 *   V: rows [position] of head_dim values: f32 or f16 values, or q8_0 blocks of 32 (a half
 *      scale then 32 int8, GGUF's Q8_0 block).
 * A row or tile of q8_0 holds the same bytes per position as its payload row (row_bytes).
 * Scores and outputs are accumulated in float32 whatever the stored type.
 */
#ifndef DS4N_ATTENTION_H
#define DS4N_ATTENTION_H

#include <stdint.h>

#define DS4N_KT 16       /* positions per K tile */
#define DS4N_KBLOCK 64   /* keys per online-softmax step (a multiple of DS4N_KT) */

/* KV element types (the numbers are part of the ctypes ABI and of the session payload). */
enum { DS4N_KV_F32 = 0, DS4N_KV_F16 = 1, DS4N_KV_Q8_0 = 2 };
#define DS4N_KV_QK 32    /* values per q8_0 block */
#define DS4N_KV_QB 34    /* bytes per q8_0 block: a half scale, 32 int8 */

/* Bytes of one position's head_dim values in type (0 for an unknown type or a head_dim
 * q8_0 cannot hold: not a multiple of DS4N_KV_QK). A K tile is DS4N_KT times this. */
static inline int64_t ds4n_kv_row_bytes(int type, int head_dim) {
    if (head_dim <= 0) return 0;
    switch (type) {
    case DS4N_KV_F32: return 4 * (int64_t)head_dim;
    case DS4N_KV_F16: return 2 * (int64_t)head_dim;
    case DS4N_KV_Q8_0:
        return head_dim % DS4N_KV_QK ? 0 : (int64_t)head_dim / DS4N_KV_QK * DS4N_KV_QB;
    default: return 0;
    }
}

/* float -> IEEE half, rounded to nearest even (overflow to inf, subnormals kept, nan kept). */
uint16_t ds4n_f32_to_f16(float f);
/* h[i * stride] = ds4n_f32_to_f16(x[i]) for i < n, in vectors where the level in force has
 * them (F16C's conversion rounds to nearest even and quiets a nan keeping its top payload
 * bits, as the scalar one does: bitwise the same; tested). */
void ds4n_f32_to_f16_n(const float *x, int n, uint16_t *h, int64_t stride);
#if defined(__x86_64__) || defined(_M_X64)
void ds4n_f32_to_f16_n_avx2(const float *x, int n, uint16_t *h, int64_t stride);
#endif
/* Quantizes 32 values as one q8_0 block (GGUF's rule: scale = max|x|/127, q = round(x/scale)):
 * the half scale to *d, the int8 values to q[i * q_stride], i < 32. */
void ds4n_kv_quant_block(const float *x, uint16_t *d, int8_t *q, int q_stride);

/* One position of one head in the payload row format (row_bytes), from head_dim floats. */
void ds4n_kv_pack_row(int type, const float *x, int head_dim, void *row);
/* Writes one position into a K tile (tile = the start of its DS4N_KT-position tile, lane =
 * pos % DS4N_KT) from head_dim floats; ds4n_kv_tile_put / _get move a payload row in or out
 * of the tile unchanged. */
void ds4n_kv_tile_store(int type, const float *x, int head_dim, void *tile, int lane);
void ds4n_kv_tile_put(int type, const void *row, int head_dim, void *tile, int lane);
void ds4n_kv_tile_get(int type, const void *tile, int lane, int head_dim, void *row);
/* Value d of a position, from a row or from a tile (the scalar kernel's and tests' access). */
float ds4n_kv_row_at(int type, const void *row, int d);
float ds4n_kv_tile_at(int type, const void *tile, int lane, int d, int head_dim);

typedef struct ds4n_attn_job {
    const float *q;    /* row (t, g) at q + t*q_stride + g*head_dim, pre-scaled by 1/sqrt(hd) */
    int64_t q_stride;
    float *o;          /* output rows, same addressing with o_stride */
    int64_t o_stride;
    int n_tok;         /* query tokens */
    int n_group;       /* query heads sharing this kv head */
    int head_dim;
    int64_t pos0;      /* absolute position of the first query token */
    const void *k;     /* K tiles of this (layer, kv head) */
    const void *v;     /* V rows of this (layer, kv head) */
    int kv_type;       /* DS4N_KV_*: the element type of k and v (0: float32) */
    int64_t k0, k1;    /* keys visited: [k0, min(k1, pos+1)) for a query at position pos */
    /* > 0: a sliding window, the keys less than `window` positions from the query: causal,
     * keys [pos-window+1, pos]; not causal, [pos-window+1, pos+window-1] (a symmetric
     * window, EmbeddingGemma's). 0: all. */
    int64_t window;
    /* > 0: not causal (an encoder's bidirectional attention): every query sees the keys
     * [k0, min(k1, keys_end)) whatever its position (keys_end: one past the sequence's last
     * position), within its window if there is one. 0: causal. */
    int64_t keys_end;
    /* Optional attention sinks: sinks[g] is an extra logit of query head g in the softmax
     * denominator (no value). Applied only when the job normalizes (m == NULL); a split-key
     * caller adds it when it merges the partials. */
    const float *sinks;
    /* Split-key mode when non-NULL: o receives the unnormalized sum and m / l (one per row
     * r = t*n_group + g) the running max and sum, for ds4n_attn_merge. */
    float *m, *l;
} ds4n_attn_job;

/* One past the last key a query at pos sees (before k1): pos + 1 when causal, else the
 * sequence's end, or the end of its symmetric window when that comes first. */
static inline int64_t ds4n_attn_keys_hi(const ds4n_attn_job *j, int64_t pos) {
    if (j->keys_end <= 0) return pos + 1;
    return j->window > 0 && pos + j->window < j->keys_end ? pos + j->window : j->keys_end;
}

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
void ds4n_attn_avx512(const ds4n_attn_job *job, float *scratch);
#endif
#if defined(__aarch64__)
void ds4n_attn_neon(const ds4n_attn_job *job, float *scratch);
#endif

/* g[i] = silu(g[i]) * u[i] (the SwiGLU gate), with the best kernel set in force. */
void ds4n_swiglu(float *g, const float *u, int64_t n);
void ds4n_swiglu_scalar(float *g, const float *u, int64_t n);
#if defined(__x86_64__) || defined(_M_X64)
void ds4n_swiglu_avx2(float *g, const float *u, int64_t n);
void ds4n_swiglu_avx512(float *g, const float *u, int64_t n);
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
void ds4n_geglu_avx512(float *g, const float *u, int64_t n);
#endif
#if defined(__aarch64__)
void ds4n_geglu_neon(float *g, const float *u, int64_t n);
#endif

#endif
