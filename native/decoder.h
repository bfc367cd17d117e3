/* Shared pieces of the attention-based decoder families (llama.c, qwen, gemma3, phi3, ...):
 * a family's C file is its layer loop and its quirks, composed from these.
 *
 * Conventions: activations are float32 rows, T tokens x width, row-major. Weight matrices
 * are GGUF tensors of any type ds4n_type_supported() accepts (rows of ne0 = input width);
 * norm weights, biases, rope factors and sinks are float32 vectors. NULL means absent.
 *
 *   KV cache (ds4n_kv): K and V of every layer for positions [0, n_ctx), in the element
 *     type chosen at init (DS4N_KV_F32, _F16 or _Q8_0 of attention.h, which also gives the
 *     layout). ds4n_kv_init / ds4n_kv_release; ds4n_kv_store converts and writes one
 *     position; ds4n_kv_get_rows / ds4n_kv_set_rows copy the rows [start, start + n) of
 *     one layer unchanged, in the stored type, as [n_head_kv][n][row_bytes] (the session
 *     payload format; a delta payload holds the rows after its base), ds4n_kv_get /
 *     ds4n_kv_set those of [0, n).
 *
 *   Workspace (ds4n_dec_ws): scratch of the attention and FFN steps. Call
 *     ds4n_dec_ws_reserve(ws, dims, rows, n_units, n_threads) before an eval of rows tokens
 *     in n_units attention units (it is the only call that allocates, so a failure there leaves
 *     every session untouched), and
 *     ds4n_dec_ws_release at the end. Zero-initialize the struct first.
 *
 *   Weight table (ds4n_dec_weights): a family's tensor pointers and GGUF types in its slot
 *     order (globals, then each layer's slots), copied from the caller by
 *     ds4n_dec_weights_init; ds4n_dec_layer_w / ds4n_dec_layer_wt give one layer's slots.
 *
 *   Norms: ds4n_rms_norm (rows of n, weight of n; also used per head with n = head_dim).
 *
 *   RoPE (ds4n_rope): ds4n_rope_init from ds4n_rope_params — llama.cpp's NORMAL (adjacent
 *     pairs) or NEOX (halves) rotation of the first n_rot dims of each head, theta_i =
 *     pos * base^(-2i/n_rot) / freq_factor_i, with linear scaling (freq_scale) and YaRN
 *     (ext_factor > 0: llama.cpp's ramp between interpolated and extrapolated angles and its
 *     magnitude factor) and an attention factor multiplying cos and sin. One ds4n_rope per
 *     distinct base (Gemma 3's local layers have their own).
 *
 *   Attention (ds4n_attention): the whole block after the input norm — Q/K/V projections
 *     (separate or one fused QKV tensor, rows Q then K then V) with optional biases, optional
 *     per-head RMSNorm of q and k (weights of head_dim), RoPE, q times q_scale, K/V stored
 *     at each sequence's positions, causal GQA attention with an optional sliding window
 *     (keys [pos-window+1, pos]) and optional per-head sink logits, output projection with
 *     optional bias. out receives the batch's rows x n_embd (the caller adds the residual).
 *
 *   Batch (ds4n_dec_batch): one forward call over several sessions. The residual stream is
 *     the concatenation of every sequence's rows (sequence i has count[i] >= 1 new tokens
 *     at its own positions); norms, projections and the FFN run over all rows at once, so
 *     each weight matrix is read once per call; RoPE, the K/V store and attention run per
 *     sequence on its own cache. A single-session eval is the batch of one. A family's
 *     eval is:
 *       rc = ds4n_dec_batch_begin(&b, model dims, n_layer, sessions, n_seq, counts, pool,
 *                                 embd, embd_type, n_vocab, tokens, embd_scale);
 *       per layer: ds4n_rms_norm(b.x -> b.xn over b.n_rows), ds4n_attention(... &b ...),
 *                  add b.tmp to b.x, the FFN likewise;
 *       ds4n_dec_batch_finish(&b, pool, output norm, head, ..., logits, n_logits).
 *
 *   Projections (ds4n_dec_project): every matmul over batch rows. Each row must get exactly
 *     what it gets when its session is evaluated alone: sequences of at most
 *     DS4N_DEC_SMALL_T rows are computed together as decode rows (bitwise the T = 1
 *     product), a longer one by the same call it makes alone.
 *
 *   FFN (ds4n_ffn): gate and up projections (or one fused tensor whose rows are gate then
 *     up), act(gate) * up with SiLU or GELU (tanh approximation), down projection.
 *     out receives the batch's rows x n_embd.
 */
#ifndef DS4N_DECODER_H
#define DS4N_DECODER_H

#include <stdint.h>

#include "attention.h"
#include "ds4n.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ds4n_dec_dims {
    int32_t n_embd, n_head, n_head_kv, head_dim;
    int32_t n_ff;      /* widest FFN the workspace must hold (0: the caller has its own) */
    float norm_eps;    /* of the per-head q/k norms */
} ds4n_dec_dims;

/* ---- KV cache ----------------------------------------------------------------------- */

typedef struct ds4n_kv {
    int n_layer, n_head_kv, head_dim, type;
    int64_t n_ctx, n_ctx_pad;
    int64_t row_bytes; /* one position of one head in the stored type */
    char *k, *v;       /* [layer][kv head][n_ctx_pad positions] */
} ds4n_kv;

/* 0, or -1 (bad shape or type, q8_0 with head_dim not a multiple of 32, no memory).
 * Untouched positions stay unbacked zero pages. */
int ds4n_kv_init(ds4n_kv *kv, int n_layer, int n_head_kv, int head_dim, int64_t n_ctx,
                 int type);
void ds4n_kv_release(ds4n_kv *kv);
int64_t ds4n_kv_bytes(const ds4n_kv *kv);
void *ds4n_kv_k(const ds4n_kv *kv, int layer, int kv_head);
void *ds4n_kv_v(const ds4n_kv *kv, int layer, int kv_head);
/* k, v: float rows of n_head_kv * head_dim for one position (pos < n_ctx, checked by the
 * caller), converted to the stored type. */
void ds4n_kv_store(ds4n_kv *kv, int layer, int64_t pos, const float *k, const float *v);
/* which: 0 = K, 1 = V; dst / src hold n_head_kv * n * row_bytes bytes. Returns 0, or -1 on
 * a bad layer, which or range. */
int ds4n_kv_get(const ds4n_kv *kv, int layer, int which, int64_t n, void *dst);
int ds4n_kv_set(ds4n_kv *kv, int layer, int which, int64_t n, const void *src);
int ds4n_kv_get_rows(const ds4n_kv *kv, int layer, int which, int64_t start, int64_t n,
                     void *dst);
int ds4n_kv_set_rows(ds4n_kv *kv, int layer, int which, int64_t start, int64_t n,
                     const void *src);
/* Bytes of one position of one head of head_dim in type (attention.h's ds4n_kv_row_bytes,
 * for ctypes): 0 when the type cannot hold that head_dim. */
int64_t ds4n_kv_type_row_bytes(int type, int head_dim);

/* ---- norms, pool helper ------------------------------------------------------------- */

/* out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, for rows of n (out may be x). */
void ds4n_rms_norm(const float *x, const float *w, float *out, int64_t rows, int n, float eps);

/* fn on every worker of the pool, or once on the caller (ith 0 of 1) when pool is NULL. */
void ds4n_dec_run(ds4n_pool *pool, void (*fn)(void *, int, int), void *ctx);

/* ---- RoPE --------------------------------------------------------------------------- */

enum { DS4N_ROPE_NORMAL = 0, DS4N_ROPE_NEOX = 2 }; /* llama.cpp's rope type numbers */

typedef struct ds4n_rope_params {
    int32_t n_rot, mode;
    float base;
    float freq_scale;           /* 1 / scaling factor (1: none) */
    const float *freq_factors;  /* n_rot/2 divisors of the angle rates, or NULL */
    float ext_factor;           /* YaRN: > 0 enables the ramp (1 for YaRN models) */
    float attn_factor;          /* multiplies cos and sin (1: none) */
    float beta_fast, beta_slow; /* YaRN correction range (32, 1 in llama.cpp) */
    int32_t n_ctx_orig;         /* YaRN: the training context before scaling */
    int32_t yarn_exact_range;   /* nonzero: the ramp's ends are not rounded to whole dims
                                 * (transformers' truncate=False, e.g. gpt-oss) */
} ds4n_rope_params;

#define DS4N_ROPE_MAX_DIMS 1024

typedef struct ds4n_rope {
    int32_t n_rot, mode;
    float mscale;                           /* applied to cos and sin */
    float inv_freq[DS4N_ROPE_MAX_DIMS / 2]; /* angle per position of each pair */
} ds4n_rope;

/* 0, or -1 on a bad n_rot (odd, <= 0, > DS4N_ROPE_MAX_DIMS), mode or base. */
int ds4n_rope_init(ds4n_rope *rope, const ds4n_rope_params *p);
/* cs[t*n_rot + 2i], cs[t*n_rot + 2i + 1] = cos, sin of pair i at position pos0 + t. */
void ds4n_rope_table(const ds4n_rope *rope, int64_t pos0, int64_t T, float *cs);
/* Rotates the first n_rot dims of n_heads heads of head_dim (one token, angles cs of that
 * token) and multiplies the whole head by scale. */
void ds4n_rope_apply(const ds4n_rope *rope, float *x, const float *cs, int n_heads,
                     int head_dim, float scale);

/* ---- workspace ---------------------------------------------------------------------- */

#define DS4N_WS_ROPES 2 /* rope tables held at once (distinct ds4n_rope objects per eval) */

typedef struct ds4n_dec_ws {
    int64_t cap_tok;
    int32_t cap_q, cap_kv, cap_ff, cap_rot;
    float *q, *kx, *vx, *att, *qkv, *gate, *gu;
    float *rope_cs[DS4N_WS_ROPES]; /* per row of the current call */
    const ds4n_rope *rope_of[DS4N_WS_ROPES];
    uint64_t rope_call[DS4N_WS_ROPES], call; /* a table is valid for the call it was made in */
    int cap_threads;
    int64_t attn_floats; /* per thread */
    float *attn_scratch;
    int64_t cap_part;
    float *part;         /* split-key partials */
} ds4n_dec_ws;

/* n_units: the attention units of the call (a sequence, or each row of a sequence of at
 * most DS4N_DEC_SMALL_T rows: decoder_attention.c), each with split-key partials of its
 * own. 0, or -1 when out of memory (the workspace is then empty but valid). */
int ds4n_dec_ws_reserve(ds4n_dec_ws *ws, const ds4n_dec_dims *d, int64_t rows, int n_units,
                        int n_threads);
void ds4n_dec_ws_release(ds4n_dec_ws *ws);

/* ---- batch -------------------------------------------------------------------------- */

#define DS4N_DEC_MAX_SEQ 64 /* sequences in one call */

/* Rows per matmul call whose every row is bitwise the T = 1 (decode) product: ds4n_matmul's
 * small-batch path (DS4N_SMALL_T in quants.h; decoder.c checks this is not above it) reads
 * each weight row once for all of them. 1 would mean a call per row. */
#define DS4N_DEC_SMALL_T 8

struct ds4n_dec_session;

/* One call's sequences. The row buffers and workspace are the first session's, grown to
 * hold every row; the others' are not touched. */
typedef struct ds4n_dec_batch {
    int n_seq;
    struct ds4n_dec_session *const *seq;
    const int64_t *count;                  /* new tokens of each sequence (>= 1) */
    int64_t row0[DS4N_DEC_MAX_SEQ];        /* its first row in the residual stream */
    int64_t pos0[DS4N_DEC_MAX_SEQ];        /* its n_past when the call began */
    int64_t n_rows;
    float *x, *xn, *tmp;                   /* residual, normalized rows, a step's output */
    ds4n_dec_ws *ws;
    int bidir; /* attention is not causal: every row sees all its sequence's keys (encoders,
                * set by the caller after ds4n_dec_batch_begin; 0 there) */
} ds4n_dec_batch;

/* Y (n x rows) = X (n x K) times W transposed: with small, n decode rows (in calls of
 * DS4N_DEC_SMALL_T rows), else one call of n rows; worker ith of nth's share, for callers
 * already inside a pool task. */
void ds4n_dec_rows_part(int type, const void *W, int64_t rows, int64_t K, const float *X,
                        int64_t n, int small, float *Y, int ith, int nth);
/* The same over the concatenated rows of n_seq sequences of count[i] rows each, every row
 * computed as its sequence alone computes it: a sequence of more than DS4N_DEC_SMALL_T rows
 * in its own call, consecutive shorter ones as decode rows together (so decode steps of
 * many sessions stream each weight matrix once per DS4N_DEC_SMALL_T rows). */
void ds4n_dec_project_part(int type, const void *W, int64_t rows, int64_t K, const float *X,
                           const int64_t *count, int n_seq, float *Y, int ith, int nth);
void ds4n_dec_project(ds4n_pool *pool, int type, const void *W, int64_t rows, int64_t K,
                      const float *X, const int64_t *count, int n_seq, float *Y);
/* The cos/sin table of rope for every row of the batch (each at its sequence's position),
 * computed once per call. */
const float *ds4n_dec_ws_rope(const ds4n_dec_batch *b, const ds4n_rope *rope);

/* ---- attention ---------------------------------------------------------------------- */

typedef struct ds4n_attn_layer {
    const void *wq, *wk, *wv; /* n_embd -> n_head*hd, n_head_kv*hd, n_head_kv*hd */
    const void *wqkv;         /* or fused (wq, wk, wv NULL) */
    const void *wo;           /* n_head*hd -> n_embd */
    int32_t tq, tk, tv, tqkv, to;
    const float *bq, *bk, *bv, *bqkv, *bo;
    const float *q_norm, *k_norm; /* head_dim each */
    const float *sinks;           /* n_head */
    const ds4n_rope *rope;        /* NULL: no rotation (absolute-position encoders) */
    const ds4n_rope *rope_long;   /* optional: the rope of sessions with n_ctx > long_ctx */
    int64_t long_ctx;
    float q_scale;                /* e.g. 1/sqrt(head_dim) */
    int64_t window;               /* 0: full causal */
} ds4n_attn_layer;

/* xn: the batch's normalized rows of n_embd (ds4n_dec_batch_begin checked that every
 * sequence's positions fit its cache and reserved the workspace). */
void ds4n_attention(const ds4n_dec_dims *d, const ds4n_attn_layer *w, int layer,
                    const ds4n_dec_batch *b, ds4n_pool *pool, const float *xn, float *out);

/* ---- FFN ---------------------------------------------------------------------------- */

enum { DS4N_ACT_SILU = 0, DS4N_ACT_GELU_TANH = 1 };

typedef struct ds4n_ffn_layer {
    const void *gate, *up, *down; /* gate NULL: up holds 2*n_ff rows, gate then up */
    int32_t tgate, tup, tdown;
    int32_t act;
} ds4n_ffn_layer;

void ds4n_ffn(const ds4n_dec_dims *d, const ds4n_ffn_layer *w, const ds4n_dec_batch *b,
              ds4n_pool *pool, const float *xn, float *out);

/* ---- weight table ------------------------------------------------------------------- */

/* A family's tensors and their GGUF types, in its slot order: n_global model-wide slots, then
 * n_per_layer slots of each layer. A NULL tensor is an absent one. */
typedef struct ds4n_dec_weights {
    int n_global, n_per_layer, n_layer;
    const void **w;
    int32_t *type;
} ds4n_dec_weights;

/* Copies the caller's tables (of n_global + n_layer * n_per_layer entries). 0, or -1 on a bad
 * count or no memory (t is then empty; ds4n_dec_weights_free is still safe). */
int ds4n_dec_weights_init(ds4n_dec_weights *t, int n_global, int n_per_layer, int n_layer,
                          const void *const *tensors, const int32_t *types);
void ds4n_dec_weights_free(ds4n_dec_weights *t);

/* The n_per_layer tensors of layer il and their types, indexed by the family's slot enum. */
static inline const void *const *ds4n_dec_layer_w(const ds4n_dec_weights *t, int il) {
    return t->w + t->n_global + (int64_t)il * t->n_per_layer;
}
static inline const int32_t *ds4n_dec_layer_wt(const ds4n_dec_weights *t, int il) {
    return t->type + t->n_global + (int64_t)il * t->n_per_layer;
}

/* x[i] += y[i] for i < n (a residual add). */
void ds4n_dec_add_rows(float *x, const float *y, int64_t n);

/* ---- session ------------------------------------------------------------------------ */

/* Results of the eval calls of the families built on these pieces (moe.h adds
 * DS4N_ERR_BAD_EXPERT = -4). BAD_BATCH: n_seq outside [1, DS4N_DEC_MAX_SEQ], a count < 1, a
 * session given twice, NULL or of another model's shape. */
enum { DS4N_OK = 0, DS4N_ERR_CONTEXT_FULL = -1, DS4N_ERR_BAD_TOKEN = -2, DS4N_ERR_NO_MEMORY = -3,
       DS4N_ERR_BAD_BATCH = -5 };

/* One sequence's state: KV cache sized to n_ctx, the position count, and (used when it is
 * the first session of a call) the workspace and the residual-stream rows. */
typedef struct ds4n_dec_session {
    ds4n_dec_dims dims;
    int64_t n_ctx, n_past;
    ds4n_kv kv;
    ds4n_dec_ws ws;
    int64_t cap_tok;
    float *x, *xn, *tmp; /* residual stream, normalized rows, a step's output: T x n_embd */
    struct ds4n_steer *steer; /* steering of this session's rows (steer.h), or NULL */
} ds4n_dec_session;

/* kv_type: DS4N_KV_F32, _F16 or _Q8_0 of attention.h. NULL on a bad shape or type, or no
 * memory. */
ds4n_dec_session *ds4n_dec_session_new(const ds4n_dec_dims *d, int n_layer, int64_t n_ctx,
                                       int kv_type);
void ds4n_dec_session_free(ds4n_dec_session *s);
int64_t ds4n_dec_session_n_past(const ds4n_dec_session *s);
int64_t ds4n_dec_session_n_ctx(const ds4n_dec_session *s);
int64_t ds4n_dec_session_kv_bytes(const ds4n_dec_session *s);
int ds4n_dec_session_kv_type(const ds4n_dec_session *s);
/* Truncation (rewind), or after ds4n_dec_session_kv_set of every layer the count of a loaded
 * state. 0, or -1 when n is outside [0, n_ctx]. */
int ds4n_dec_session_set_n_past(ds4n_dec_session *s, int64_t n);
/* Rows [start, start + n) of one layer's K (which 0) or V (which 1), row_bytes each in the
 * stored type; 0, or -1 when the layer, the side or the range is outside the cache. */
int ds4n_dec_session_kv_get(const ds4n_dec_session *s, int layer, int which, int64_t start,
                            int64_t n, void *dst);
int ds4n_dec_session_kv_set(ds4n_dec_session *s, int layer, int which, int64_t start,
                            int64_t n, const void *src);

/* Checks the call (1 <= n_seq <= DS4N_DEC_MAX_SEQ, distinct sessions of the model's dims
 * and n_layer, every count >= 1 and fitting its session's context, token ids in
 * [0, n_vocab)), reserves all scratch, and writes the embedding rows of tokens (the
 * sequences' tokens one after the other) to b->x, times embd_scale when it is not 1.
 * DS4N_OK, or an error with no session changed. */
int ds4n_dec_batch_begin(ds4n_dec_batch *b, const ds4n_dec_dims *dims, int n_layer,
                         ds4n_dec_session *const *sessions, int n_seq, const int64_t *count,
                         ds4n_pool *pool, const void *embd, int32_t embd_type, int32_t n_vocab,
                         const int32_t *tokens, float embd_scale);
/* Advances every sequence's n_past by its count; when logits is not NULL, fills it with
 * the logits of each sequence's last n_logits[i] rows (1 <= n_logits[i] <= count[i],
 * checked by the caller), one sequence after the other (sum of n_logits x n_vocab), or
 * with each sequence's last row's when n_logits is NULL (n_seq x n_vocab):
 * RMSNorm(norm_w, eps), the head matrix, then softcap * tanh(logit / softcap) when
 * softcap > 0. */
void ds4n_dec_batch_finish(ds4n_dec_batch *b, ds4n_pool *pool, const float *norm_w, float eps,
                           const void *head, int32_t head_type, int32_t n_vocab, float *logits,
                           const int64_t *n_logits, float softcap);

#ifdef __cplusplus
}
#endif
#endif
