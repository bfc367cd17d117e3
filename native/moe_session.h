/* The session of the MoE decoder families (qwen3moe.c, gptoss.c): one conversation's KV
 * cache (decoder.h), its working memory, its MoE scratch with the expert-read counter, and
 * its position count. The families' eval functions run their layer loop on it; everything
 * else about a session (size, rewind, KV rows for save/load) is here, once.
 */
#ifndef DS4N_MOE_SESSION_H
#define DS4N_MOE_SESSION_H

#include <stdint.h>

#include "decoder.h"
#include "moe.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ds4n_moe_session {
    ds4n_dec_dims dims;
    int64_t n_ctx, n_past;
    ds4n_kv kv;
    ds4n_dec_ws ws;
    ds4n_moe_scratch *moe;
    int64_t cap_tok;
    float *x, *xn, *tmp; /* T rows of n_embd: residual stream, normalized, block output */
} ds4n_moe_session;

/* Return codes of the families' eval. */
enum {
    DS4N_MOE_SESS_OK = 0, DS4N_MOE_SESS_CONTEXT_FULL = -1, DS4N_MOE_SESS_BAD_TOKEN = -2,
    DS4N_MOE_SESS_NO_MEMORY = -3, DS4N_MOE_SESS_BAD_EXPERT = -4
};

/* NULL on a bad size or no memory. dims->n_ff is ignored (the experts have their own). */
ds4n_moe_session *ds4n_moe_session_new(const ds4n_dec_dims *dims, int n_layer, int64_t n_ctx);
void ds4n_moe_session_free(ds4n_moe_session *s);
int64_t ds4n_moe_session_n_past(const ds4n_moe_session *s);
int64_t ds4n_moe_session_n_ctx(const ds4n_moe_session *s);
/* Bytes of KV memory the session reserved for its n_ctx. */
int64_t ds4n_moe_session_kv_bytes(const ds4n_moe_session *s);
/* Bytes of expert weights the session's evals have read so far (ds4n_moe_expert_bytes). */
int64_t ds4n_moe_session_expert_bytes(const ds4n_moe_session *s);
/* n <= n_ctx held positions (rewind, or the count of a loaded state). 0, or -1. */
int ds4n_moe_session_set_n_past(ds4n_moe_session *s, int64_t n);
/* K (which 0) or V (1) of one layer for positions [0, n) as [n_head_kv][n][head_dim]. */
int ds4n_moe_session_kv_get(const ds4n_moe_session *s, int layer, int which, int64_t n,
                            float *dst);
int ds4n_moe_session_kv_set(ds4n_moe_session *s, int layer, int which, int64_t n,
                            const float *src);

/* For the families' eval: checks that T tokens fit and are ids below n_vocab, and makes
 * room for T tokens on nth threads (moe: the largest of the model's MoE layers). A status
 * code; on an error nothing changed. */
int ds4n_moe_session_prepare(ds4n_moe_session *s, const int32_t *tokens, int64_t T,
                             int32_t n_vocab, int nth, const ds4n_moe *moe);

/* The status code of a ds4n_moe_forward failure. */
int ds4n_moe_session_status(int moe_rc);

/* The rows of tokens from an embedding table (n_vocab rows of n_embd, any type) into s->x. */
void ds4n_moe_session_embed(ds4n_moe_session *s, int type, const void *table,
                            const int32_t *tokens, int64_t T);

/* Final norm and output head over the last row (or every row when all_logits) into logits
 * (may be NULL: nothing to do). */
void ds4n_moe_session_logits(ds4n_moe_session *s, ds4n_pool *pool, int64_t T,
                             const float *norm, float eps, int head_type, const void *head,
                             int32_t n_vocab, float *logits, int all_logits);

#ifdef __cplusplus
}
#endif
#endif
