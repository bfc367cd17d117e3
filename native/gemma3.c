/* The gemma3 forward pass (see gemma3.h), composed of the decoder pieces. */
#include "gemma3.h"

#include <math.h>

#include "steer.h"

typedef struct gemma3 {
    ds4n_dec_model base; /* first: the model is freed through it */
    ds4n_gemma3_hparams hp;
    ds4n_rope rope_global, rope_local;
} gemma3;

static int is_local(const ds4n_gemma3_hparams *hp, int il) {
    return hp->window > 0 && il % hp->swa_pattern < hp->swa_pattern - 1;
}

static int layers(const ds4n_dec_model *base, ds4n_dec_batch *b, ds4n_pool *pool) {
    const gemma3 *m = (const gemma3 *)base;
    const ds4n_gemma3_hparams *hp = &m->hp;
    const int64_t T = b->n_rows;
    const int E = hp->shape.n_embd;
    const float eps = hp->shape.rms_eps;
    for (int il = 0; il < hp->shape.n_layer; il++) {
        const void *const *lw = ds4n_dec_layer_w(&base->wt, il);
        const int32_t *lt = ds4n_dec_layer_wt(&base->wt, il);
        const int local = is_local(hp, il);
        const ds4n_attn_layer al = {
            .wq = lw[DS4N_GEMMA3_WQ], .tq = lt[DS4N_GEMMA3_WQ],
            .wk = lw[DS4N_GEMMA3_WK], .tk = lt[DS4N_GEMMA3_WK],
            .wv = lw[DS4N_GEMMA3_WV], .tv = lt[DS4N_GEMMA3_WV],
            .wo = lw[DS4N_GEMMA3_WO], .to = lt[DS4N_GEMMA3_WO],
            .q_norm = lw[DS4N_GEMMA3_Q_NORM], .k_norm = lw[DS4N_GEMMA3_K_NORM],
            .rope = local ? &m->rope_local : &m->rope_global, .q_scale = hp->q_scale,
            .window = local ? hp->window : 0,
        };
        ds4n_rms_norm(b->x, lw[DS4N_GEMMA3_ATTN_NORM], b->xn, T, E, eps);
        ds4n_attention(&base->dims, &al, il, b, pool, b->xn, b->tmp);
        ds4n_rms_norm(b->tmp, lw[DS4N_GEMMA3_POST_ATTN_NORM], b->tmp, T, E, eps);
        ds4n_dec_residual(b, il, DS4N_STEER_ATTN);

        const ds4n_ffn_layer fl = {
            .gate = lw[DS4N_GEMMA3_W_GATE], .tgate = lt[DS4N_GEMMA3_W_GATE],
            .up = lw[DS4N_GEMMA3_W_UP], .tup = lt[DS4N_GEMMA3_W_UP],
            .down = lw[DS4N_GEMMA3_W_DOWN], .tdown = lt[DS4N_GEMMA3_W_DOWN],
            .act = DS4N_ACT_GELU_TANH,
        };
        ds4n_rms_norm(b->x, lw[DS4N_GEMMA3_FFN_NORM], b->xn, T, E, eps);
        ds4n_ffn(&base->dims, &fl, b, pool, b->xn, b->tmp);
        ds4n_rms_norm(b->tmp, lw[DS4N_GEMMA3_POST_FFN_NORM], b->tmp, T, E, eps);
        ds4n_dec_residual(b, il, DS4N_STEER_FFN);
    }
    return DS4N_OK;
}

ds4n_dec_model *ds4n_gemma3_new(const ds4n_gemma3_hparams *hp, const void *const *tensors,
                                const int32_t *types) {
    if (hp->shape.n_ff <= 0 || hp->window < 0 || hp->swa_pattern <= 0 ||
        !(hp->softcap >= 0.0f) || (hp->bidirectional != 0 && hp->bidirectional != 1))
        return NULL;
    gemma3 *m = ds4n_dec_model_new(sizeof *m, &hp->shape, DS4N_GEMMA3_N_GLOBAL,
                                   DS4N_GEMMA3_N_PER_LAYER, tensors, types, layers);
    if (!m) return NULL;
    m->hp = *hp;
    m->base.embd_scale = sqrtf((float)hp->shape.n_embd);
    m->base.softcap = hp->softcap;
    m->base.bidirectional = hp->bidirectional;
    const ds4n_rope_params global = {.n_rot = hp->shape.n_rot, .mode = DS4N_ROPE_NEOX,
                                     .base = hp->shape.rope_base, .freq_scale = hp->rope_scale};
    const ds4n_rope_params local = {.n_rot = hp->shape.n_rot, .mode = DS4N_ROPE_NEOX,
                                    .base = hp->rope_base_local, .freq_scale = 1.0f};
    if (ds4n_rope_init(&m->rope_global, &global) != 0 ||
        ds4n_rope_init(&m->rope_local, &local) != 0) {
        ds4n_dec_model_free(&m->base);
        return NULL;
    }
    return &m->base;
}
