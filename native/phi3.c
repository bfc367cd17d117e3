/* The phi3 forward pass (see phi3.h), composed of the decoder pieces. */
#include "phi3.h"

#include <math.h>

#include "steer.h"

typedef struct phi3 {
    ds4n_dec_model base; /* first: the model is freed through it */
    int32_t window;
    int64_t long_ctx;
    ds4n_rope rope_short, rope_long; /* the same when the file has no factors */
} phi3;

static int layers(const ds4n_dec_model *base, ds4n_dec_batch *b, ds4n_pool *pool) {
    const phi3 *m = (const phi3 *)base;
    const ds4n_dec_shape *hp = &base->shape;
    const int64_t T = b->n_rows;
    const int E = hp->n_embd;
    for (int il = 0; il < hp->n_layer; il++) {
        const void *const *lw = ds4n_dec_layer_w(&base->wt, il);
        const int32_t *lt = ds4n_dec_layer_wt(&base->wt, il);
        const ds4n_attn_layer al = {
            .wqkv = lw[DS4N_PHI3_WQKV], .tqkv = lt[DS4N_PHI3_WQKV],
            .wo = lw[DS4N_PHI3_WO], .to = lt[DS4N_PHI3_WO],
            /* A session's rope is fixed by its context size, so its cached keys stay valid. */
            .rope = &m->rope_short, .rope_long = &m->rope_long, .long_ctx = m->long_ctx,
            .q_scale = 1.0f / sqrtf((float)hp->head_dim), .window = m->window,
        };
        ds4n_rms_norm(b->x, lw[DS4N_PHI3_ATTN_NORM], b->xn, T, E, hp->rms_eps);
        ds4n_attention(&base->dims, &al, il, b, pool, b->xn, b->tmp);
        ds4n_dec_residual(b, il, DS4N_STEER_ATTN);

        const ds4n_ffn_layer fl = {
            .up = lw[DS4N_PHI3_W_UP], .tup = lt[DS4N_PHI3_W_UP],
            .down = lw[DS4N_PHI3_W_DOWN], .tdown = lt[DS4N_PHI3_W_DOWN],
            .act = DS4N_ACT_SILU,
        };
        ds4n_rms_norm(b->x, lw[DS4N_PHI3_FFN_NORM], b->xn, T, E, hp->rms_eps);
        ds4n_ffn(&base->dims, &fl, b, pool, b->xn, b->tmp);
        ds4n_dec_residual(b, il, DS4N_STEER_FFN);
    }
    return DS4N_OK;
}

ds4n_dec_model *ds4n_phi3_new(const ds4n_phi3_hparams *hp, const void *const *tensors,
                              const int32_t *types) {
    if (hp->shape.n_ff <= 0 || hp->window < 0 ||
        (tensors[DS4N_PHI3_ROPE_LONG] == NULL) != (tensors[DS4N_PHI3_ROPE_SHORT] == NULL))
        return NULL;
    phi3 *m = ds4n_dec_model_new(sizeof *m, &hp->shape, DS4N_PHI3_N_GLOBAL,
                                 DS4N_PHI3_N_PER_LAYER, tensors, types, layers);
    if (!m) return NULL;
    m->window = hp->window;
    m->long_ctx = hp->scaling.n_ctx_orig;
    ds4n_rope_params rp = ds4n_dec_rope_params(&hp->shape, DS4N_ROPE_NEOX, &hp->scaling,
                                               tensors[DS4N_PHI3_ROPE_SHORT]);
    int bad = ds4n_rope_init(&m->rope_short, &rp) != 0;
    rp.freq_factors = tensors[DS4N_PHI3_ROPE_LONG];
    bad = bad || ds4n_rope_init(&m->rope_long, &rp) != 0;
    if (bad) {
        ds4n_dec_model_free(&m->base);
        return NULL;
    }
    return &m->base;
}
