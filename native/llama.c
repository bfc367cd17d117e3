/* The llama-layer forward pass (see llama.h), composed of the shared decoder pieces
 * (decoder.h, decoder_model.h), for llama itself and for Qwen 2 / Qwen 3, which differ
 * from it only in their RoPE pairing and optional parts. Per layer: RMSNorm, attention
 * (Q/K/V with optional biases, optional per-head q/k RMSNorm, RoPE, causal GQA over the KV
 * cache, output projection), residual, RMSNorm, SwiGLU FFN, residual. */
#include "llama.h"

#include <math.h>

#include "steer.h"

typedef struct llama {
    ds4n_dec_model base; /* first: the model is freed through it */
    ds4n_rope rope;
} llama;

static int layers(const ds4n_dec_model *base, ds4n_dec_batch *b, ds4n_pool *pool) {
    const llama *m = (const llama *)base;
    const ds4n_dec_shape *hp = &base->shape;
    const int E = hp->n_embd;
    const int64_t T = b->n_rows;
    for (int il = 0; il < hp->n_layer; il++) {
        const void *const *lw = ds4n_dec_layer_w(&base->wt, il);
        const int32_t *lt = ds4n_dec_layer_wt(&base->wt, il);
        const ds4n_attn_layer al = {
            .wq = lw[DS4N_LLAMA_WQ], .tq = lt[DS4N_LLAMA_WQ],
            .wk = lw[DS4N_LLAMA_WK], .tk = lt[DS4N_LLAMA_WK],
            .wv = lw[DS4N_LLAMA_WV], .tv = lt[DS4N_LLAMA_WV],
            .wo = lw[DS4N_LLAMA_WO], .to = lt[DS4N_LLAMA_WO],
            .bq = lw[DS4N_LLAMA_BQ], .bk = lw[DS4N_LLAMA_BK],
            .bv = lw[DS4N_LLAMA_BV], .bo = lw[DS4N_LLAMA_BO],
            .q_norm = lw[DS4N_LLAMA_Q_NORM], .k_norm = lw[DS4N_LLAMA_K_NORM],
            .rope = &m->rope, .q_scale = 1.0f / sqrtf((float)hp->head_dim),
        };
        ds4n_rms_norm(b->x, lw[DS4N_LLAMA_ATTN_NORM], b->xn, T, E, hp->rms_eps);
        ds4n_attention(&base->dims, &al, il, b, pool, b->xn, b->tmp);
        ds4n_dec_residual(b, il, DS4N_STEER_ATTN);

        const ds4n_ffn_layer fl = {
            .gate = lw[DS4N_LLAMA_W_GATE], .tgate = lt[DS4N_LLAMA_W_GATE],
            .up = lw[DS4N_LLAMA_W_UP], .tup = lt[DS4N_LLAMA_W_UP],
            .down = lw[DS4N_LLAMA_W_DOWN], .tdown = lt[DS4N_LLAMA_W_DOWN],
            .act = DS4N_ACT_SILU,
        };
        ds4n_rms_norm(b->x, lw[DS4N_LLAMA_FFN_NORM], b->xn, T, E, hp->rms_eps);
        ds4n_ffn(&base->dims, &fl, b, pool, b->xn, b->tmp);
        ds4n_dec_residual(b, il, DS4N_STEER_FFN);
    }
    return DS4N_OK;
}

ds4n_dec_model *ds4n_llama_new(const ds4n_llama_hparams *hp, const void *const *tensors,
                               const int32_t *types) {
    if (hp->shape.n_ff <= 0 || hp->shape.head_dim % 2 != 0) return NULL;
    llama *m = ds4n_dec_model_new(sizeof *m, &hp->shape, DS4N_LLAMA_N_GLOBAL,
                                  DS4N_LLAMA_N_PER_LAYER, tensors, types, layers);
    if (!m) return NULL;
    const int mode = hp->rope_neox ? DS4N_ROPE_NEOX : DS4N_ROPE_NORMAL;
    const ds4n_rope_params rp = ds4n_dec_rope_params(&hp->shape, mode, &hp->scaling,
                                                     m->base.wt.w[DS4N_LLAMA_ROPE_FREQS]);
    if (ds4n_rope_init(&m->rope, &rp) != 0) {
        ds4n_dec_model_free(&m->base);
        return NULL;
    }
    return &m->base;
}
