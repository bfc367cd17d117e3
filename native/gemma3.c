/* The gemma3 forward pass (see gemma3.h), composed of the decoder pieces. */
#include "gemma3.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct ds4n_gemma3 {
    ds4n_gemma3_hparams hp;
    ds4n_dec_dims dims;
    const void **w;
    int32_t *type;
    ds4n_rope rope_global, rope_local;
};

static const void *weight(const ds4n_gemma3 *m, int il, int slot) {
    return m->w[DS4N_GEMMA3_N_GLOBAL + il * DS4N_GEMMA3_N_PER_LAYER + slot];
}
static int wtype(const ds4n_gemma3 *m, int il, int slot) {
    return m->type[DS4N_GEMMA3_N_GLOBAL + il * DS4N_GEMMA3_N_PER_LAYER + slot];
}

static int is_local(const ds4n_gemma3_hparams *hp, int il) {
    return hp->window > 0 && il % hp->swa_pattern < hp->swa_pattern - 1;
}

ds4n_gemma3 *ds4n_gemma3_new(const ds4n_gemma3_hparams *hp, const void *const *tensors,
                             const int32_t *types) {
    if (hp->n_layer <= 0 || hp->n_head <= 0 || hp->n_head_kv <= 0 ||
        hp->n_head % hp->n_head_kv != 0 || hp->head_dim <= 0 || hp->n_rot > hp->head_dim ||
        hp->n_vocab <= 0 || hp->n_embd <= 0 || hp->n_ff <= 0 || hp->window < 0 ||
        hp->swa_pattern <= 0 || !(hp->softcap >= 0.0f))
        return NULL;
    const int n_slots = DS4N_GEMMA3_N_GLOBAL + hp->n_layer * DS4N_GEMMA3_N_PER_LAYER;
    ds4n_gemma3 *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->hp = *hp;
    m->dims = (ds4n_dec_dims){.n_embd = hp->n_embd, .n_head = hp->n_head,
                              .n_head_kv = hp->n_head_kv, .head_dim = hp->head_dim,
                              .n_ff = hp->n_ff, .norm_eps = hp->rms_eps};
    m->w = malloc(sizeof(void *) * n_slots);
    m->type = malloc(sizeof(int32_t) * n_slots);
    const ds4n_rope_params global = {.n_rot = hp->n_rot, .mode = DS4N_ROPE_NEOX,
                                     .base = hp->rope_base, .freq_scale = hp->rope_scale};
    const ds4n_rope_params local = {.n_rot = hp->n_rot, .mode = DS4N_ROPE_NEOX,
                                    .base = hp->rope_base_local, .freq_scale = 1.0f};
    if (!m->w || !m->type || ds4n_rope_init(&m->rope_global, &global) != 0 ||
        ds4n_rope_init(&m->rope_local, &local) != 0) {
        ds4n_gemma3_free(m);
        return NULL;
    }
    memcpy(m->w, tensors, sizeof(void *) * n_slots);
    memcpy(m->type, types, sizeof(int32_t) * n_slots);
    return m;
}

void ds4n_gemma3_free(ds4n_gemma3 *m) {
    if (!m) return;
    free(m->w);
    free(m->type);
    free(m);
}

ds4n_dec_session *ds4n_gemma3_session_new(const ds4n_gemma3 *m, int64_t n_ctx) {
    return ds4n_dec_session_new(&m->dims, m->hp.n_layer, n_ctx);
}

static void add_rows(float *x, const float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] += y[i];
}

int ds4n_gemma3_eval(const ds4n_gemma3 *m, ds4n_dec_session *s, ds4n_pool *pool,
                     const int32_t *tokens, int64_t T, float *logits, int all_logits) {
    const ds4n_gemma3_hparams *hp = &m->hp;
    const int rc = ds4n_dec_begin(s, pool, m->w[DS4N_GEMMA3_TOKEN_EMBD],
                                  m->type[DS4N_GEMMA3_TOKEN_EMBD], hp->n_vocab, tokens, T,
                                  sqrtf((float)hp->n_embd));
    if (rc != DS4N_OK || T <= 0) return rc;
    const int E = hp->n_embd;
    for (int il = 0; il < hp->n_layer; il++) {
        const int local = is_local(hp, il);
        const ds4n_attn_layer al = {
            .wq = weight(m, il, DS4N_GEMMA3_WQ), .tq = wtype(m, il, DS4N_GEMMA3_WQ),
            .wk = weight(m, il, DS4N_GEMMA3_WK), .tk = wtype(m, il, DS4N_GEMMA3_WK),
            .wv = weight(m, il, DS4N_GEMMA3_WV), .tv = wtype(m, il, DS4N_GEMMA3_WV),
            .wo = weight(m, il, DS4N_GEMMA3_WO), .to = wtype(m, il, DS4N_GEMMA3_WO),
            .q_norm = weight(m, il, DS4N_GEMMA3_Q_NORM),
            .k_norm = weight(m, il, DS4N_GEMMA3_K_NORM),
            .rope = local ? &m->rope_local : &m->rope_global, .q_scale = hp->q_scale,
            .window = local ? hp->window : 0,
        };
        ds4n_rms_norm(s->x, weight(m, il, DS4N_GEMMA3_ATTN_NORM), s->xn, T, E, hp->rms_eps);
        ds4n_attention(&m->dims, &al, &s->kv, il, &s->ws, pool, s->xn, T, s->n_past, s->tmp);
        ds4n_rms_norm(s->tmp, weight(m, il, DS4N_GEMMA3_POST_ATTN_NORM), s->tmp, T, E,
                      hp->rms_eps);
        add_rows(s->x, s->tmp, T * E);

        const ds4n_ffn_layer fl = {
            .gate = weight(m, il, DS4N_GEMMA3_W_GATE), .tgate = wtype(m, il, DS4N_GEMMA3_W_GATE),
            .up = weight(m, il, DS4N_GEMMA3_W_UP), .tup = wtype(m, il, DS4N_GEMMA3_W_UP),
            .down = weight(m, il, DS4N_GEMMA3_W_DOWN), .tdown = wtype(m, il, DS4N_GEMMA3_W_DOWN),
            .act = DS4N_ACT_GELU_TANH,
        };
        ds4n_rms_norm(s->x, weight(m, il, DS4N_GEMMA3_FFN_NORM), s->xn, T, E, hp->rms_eps);
        ds4n_ffn(&m->dims, &fl, &s->ws, pool, s->xn, T, s->tmp);
        ds4n_rms_norm(s->tmp, weight(m, il, DS4N_GEMMA3_POST_FFN_NORM), s->tmp, T, E,
                      hp->rms_eps);
        add_rows(s->x, s->tmp, T * E);
    }
    const int head = m->w[DS4N_GEMMA3_OUTPUT] ? DS4N_GEMMA3_OUTPUT : DS4N_GEMMA3_TOKEN_EMBD;
    ds4n_dec_finish(s, pool, m->w[DS4N_GEMMA3_OUTPUT_NORM], hp->rms_eps, m->w[head],
                    m->type[head], hp->n_vocab, T, logits, all_logits, hp->softcap);
    return DS4N_OK;
}
