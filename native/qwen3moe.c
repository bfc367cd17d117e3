/* The qwen3moe forward pass (see qwen3moe.h), composed from the shared decoder pieces
 * (decoder.h), the MoE FFN (moe.h) and the MoE families' session (moe_session.h). */
#include "qwen3moe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "moe_session.h"

struct ds4n_qwen3moe {
    ds4n_qwen3moe_hparams hp;
    ds4n_dec_dims dims;
    ds4n_rope rope;
    const void **w; /* DS4N_QWEN3MOE_N_GLOBAL + n_layer * DS4N_QWEN3MOE_N_PER_LAYER */
    int32_t *type;
    ds4n_attn_layer *attn; /* per layer */
    ds4n_moe *moe;         /* per layer */
};

static const void *weight(const ds4n_qwen3moe *m, int il, int slot) {
    return m->w[DS4N_QWEN3MOE_N_GLOBAL + il * DS4N_QWEN3MOE_N_PER_LAYER + slot];
}
static int wtype(const ds4n_qwen3moe *m, int il, int slot) {
    return m->type[DS4N_QWEN3MOE_N_GLOBAL + il * DS4N_QWEN3MOE_N_PER_LAYER + slot];
}

ds4n_qwen3moe *ds4n_qwen3moe_new(const ds4n_qwen3moe_hparams *hp, const void *const *tensors,
                                 const int32_t *types) {
    if (hp->n_layer <= 0 || hp->n_head <= 0 || hp->n_head_kv <= 0 ||
        hp->n_head % hp->n_head_kv != 0 || hp->head_dim <= 0 || hp->n_vocab <= 0 ||
        hp->n_embd <= 0 || hp->n_rot <= 0 || hp->n_rot > hp->head_dim)
        return NULL;
    ds4n_qwen3moe *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->hp = *hp;
    m->dims = (ds4n_dec_dims){.n_embd = hp->n_embd, .n_head = hp->n_head,
                              .n_head_kv = hp->n_head_kv, .head_dim = hp->head_dim,
                              .n_ff = 0, .norm_eps = hp->rms_eps};
    const ds4n_rope_params rp = {.n_rot = hp->n_rot, .mode = DS4N_ROPE_NEOX,
                                 .base = hp->rope_base, .freq_scale = hp->rope_freq_scale,
                                 .ext_factor = hp->rope_ext_factor,
                                 .attn_factor = hp->rope_attn_factor,
                                 .beta_fast = hp->rope_beta_fast,
                                 .beta_slow = hp->rope_beta_slow,
                                 .n_ctx_orig = hp->rope_n_ctx_orig};
    const int n_slots = DS4N_QWEN3MOE_N_GLOBAL + hp->n_layer * DS4N_QWEN3MOE_N_PER_LAYER;
    m->w = malloc(sizeof(void *) * n_slots);
    m->type = malloc(sizeof(int32_t) * n_slots);
    m->attn = calloc((size_t)hp->n_layer, sizeof *m->attn);
    m->moe = calloc((size_t)hp->n_layer, sizeof *m->moe);
    if (!m->w || !m->type || !m->attn || !m->moe || ds4n_rope_init(&m->rope, &rp) != 0) {
        ds4n_qwen3moe_free(m);
        return NULL;
    }
    memcpy(m->w, tensors, sizeof(void *) * n_slots);
    memcpy(m->type, types, sizeof(int32_t) * n_slots);
    for (int il = 0; il < hp->n_layer; il++) {
        m->attn[il] = (ds4n_attn_layer){
            .wq = weight(m, il, DS4N_QWEN3MOE_WQ), .wk = weight(m, il, DS4N_QWEN3MOE_WK),
            .wv = weight(m, il, DS4N_QWEN3MOE_WV), .wo = weight(m, il, DS4N_QWEN3MOE_WO),
            .tq = wtype(m, il, DS4N_QWEN3MOE_WQ), .tk = wtype(m, il, DS4N_QWEN3MOE_WK),
            .tv = wtype(m, il, DS4N_QWEN3MOE_WV), .to = wtype(m, il, DS4N_QWEN3MOE_WO),
            .q_norm = weight(m, il, DS4N_QWEN3MOE_Q_NORM),
            .k_norm = weight(m, il, DS4N_QWEN3MOE_K_NORM),
            .rope = &m->rope, .q_scale = 1.0f / sqrtf((float)hp->head_dim), .window = 0,
        };
        m->moe[il] = (ds4n_moe){
            .n_expert = hp->n_expert, .n_used = hp->n_used, .n_embd = hp->n_embd,
            .n_ff = hp->n_ff_exp, .gating = DS4N_MOE_SOFTMAX, .activation = DS4N_MOE_SWIGLU,
            .norm_weights = hp->norm_weights, .weights_scale = hp->weights_scale,
            .router = weight(m, il, DS4N_QWEN3MOE_GATE_INP),
            .router_type = wtype(m, il, DS4N_QWEN3MOE_GATE_INP),
            .gate = weight(m, il, DS4N_QWEN3MOE_GATE_EXPS),
            .up = weight(m, il, DS4N_QWEN3MOE_UP_EXPS),
            .down = weight(m, il, DS4N_QWEN3MOE_DOWN_EXPS),
            .gate_type = wtype(m, il, DS4N_QWEN3MOE_GATE_EXPS),
            .up_type = wtype(m, il, DS4N_QWEN3MOE_UP_EXPS),
            .down_type = wtype(m, il, DS4N_QWEN3MOE_DOWN_EXPS),
        };
        if (!ds4n_moe_valid(&m->moe[il])) {
            ds4n_qwen3moe_free(m);
            return NULL;
        }
    }
    return m;
}

void ds4n_qwen3moe_free(ds4n_qwen3moe *m) {
    if (!m) return;
    free(m->w);
    free(m->type);
    free(m->attn);
    free(m->moe);
    free(m);
}

ds4n_moe_session *ds4n_qwen3moe_session_new(const ds4n_qwen3moe *m, int64_t n_ctx) {
    return ds4n_moe_session_new(&m->dims, m->hp.n_layer, n_ctx);
}

int ds4n_qwen3moe_eval(const ds4n_qwen3moe *m, ds4n_moe_session *s, ds4n_pool *pool,
                       const int32_t *tokens, int64_t T, float *logits, int all_logits) {
    const ds4n_qwen3moe_hparams *hp = &m->hp;
    if (T <= 0) return DS4N_MOE_SESS_OK;
    const int nth = pool ? ds4n_pool_threads(pool) : 1;
    const int rc = ds4n_moe_session_prepare(s, tokens, T, hp->n_vocab, nth, &m->moe[0]);
    if (rc != DS4N_MOE_SESS_OK) return rc;
    const int E = hp->n_embd;
    ds4n_moe_session_embed(s, m->type[DS4N_QWEN3MOE_TOKEN_EMBD], m->w[DS4N_QWEN3MOE_TOKEN_EMBD],
                           tokens, T);
    for (int il = 0; il < hp->n_layer; il++) {
        ds4n_rms_norm(s->x, weight(m, il, DS4N_QWEN3MOE_ATTN_NORM), s->xn, T, E, hp->rms_eps);
        ds4n_attention(&m->dims, &m->attn[il], &s->kv, il, &s->ws, pool, s->xn, T, s->n_past,
                       s->tmp);
        for (int64_t i = 0; i < T * E; i++) s->x[i] += s->tmp[i];
        ds4n_rms_norm(s->x, weight(m, il, DS4N_QWEN3MOE_FFN_NORM), s->xn, T, E, hp->rms_eps);
        const int mrc = ds4n_moe_forward(pool, &m->moe[il], s->moe, s->xn, T, s->tmp);
        if (mrc != DS4N_MOE_OK) return ds4n_moe_session_status(mrc); /* n_past unchanged */
        for (int64_t i = 0; i < T * E; i++) s->x[i] += s->tmp[i];
    }
    s->n_past += T;
    const int head = m->w[DS4N_QWEN3MOE_OUTPUT] ? DS4N_QWEN3MOE_OUTPUT : DS4N_QWEN3MOE_TOKEN_EMBD;
    ds4n_moe_session_logits(s, pool, T, m->w[DS4N_QWEN3MOE_OUTPUT_NORM], hp->rms_eps,
                            m->type[head], m->w[head], hp->n_vocab, logits, all_logits);
    return DS4N_MOE_SESS_OK;
}
