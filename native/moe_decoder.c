/* The shared model and layer loop of the mixture-of-experts families (see moe_decoder.h). */
#include "moe_decoder.h"

#include <stdlib.h>

#include "steer.h"

static int layers(const ds4n_dec_model *base, ds4n_dec_batch *b, ds4n_pool *pool) {
    const ds4n_moe_decoder *m = (const ds4n_moe_decoder *)base;
    const int64_t T = b->n_rows;
    if (ds4n_moe_scratch_reserve(m->scratch, &m->layer[0].moe, T) != DS4N_MOE_OK)
        return DS4N_ERR_NO_MEMORY; /* every layer's experts have the same sizes */
    const int E = base->shape.n_embd;
    const float eps = base->shape.rms_eps;
    for (int il = 0; il < base->shape.n_layer; il++) {
        const ds4n_moe_layer *l = &m->layer[il];
        ds4n_rms_norm(b->x, l->attn_norm, b->xn, T, E, eps);
        ds4n_attention(&base->dims, &l->attn, il, b, pool, b->xn, b->tmp);
        ds4n_dec_residual(b, il, DS4N_STEER_ATTN);
        ds4n_rms_norm(b->x, l->ffn_norm, b->xn, T, E, eps);
        const int rc = ds4n_moe_forward_batch(pool, &l->moe, m->scratch, b->xn, b->count,
                                              b->n_seq, b->tmp);
        if (rc != DS4N_MOE_OK) /* n_past unchanged: the K/V rows written are not held */
            return rc == DS4N_MOE_ERR_BAD_EXPERT ? DS4N_ERR_BAD_EXPERT : DS4N_ERR_NO_MEMORY;
        ds4n_dec_residual(b, il, DS4N_STEER_FFN);
    }
    return DS4N_OK;
}

static void release(ds4n_dec_model *base) {
    ds4n_moe_decoder *m = (ds4n_moe_decoder *)base;
    free(m->layer);
    ds4n_moe_scratch_free(m->scratch);
}

static int layers_valid(const ds4n_moe_decoder *m) {
    const ds4n_moe *first = &m->layer[0].moe;
    for (int il = 0; il < m->base.shape.n_layer; il++) {
        const ds4n_moe *e = &m->layer[il].moe;
        if (!ds4n_moe_valid(e) || e->n_expert != first->n_expert ||
            e->n_used != first->n_used || e->n_embd != m->base.shape.n_embd ||
            e->n_ff != first->n_ff)
            return 0;
    }
    return 1;
}

void *ds4n_moe_decoder_new(size_t size, const ds4n_dec_shape *shape, int n_per_layer,
                           const void *const *tensors, const int32_t *types,
                           ds4n_moe_layer_fn describe, const void *hp) {
    if (size < sizeof(ds4n_moe_decoder) || shape->n_ff != 0) return NULL;
    ds4n_moe_decoder *m = ds4n_dec_model_new(size, shape, DS4N_DEC_N_GLOBAL, n_per_layer,
                                             tensors, types, layers);
    if (!m) return NULL;
    m->base.release = release;
    m->layer = calloc((size_t)shape->n_layer, sizeof *m->layer);
    m->scratch = ds4n_moe_scratch_new();
    if (m->layer && m->scratch)
        for (int il = 0; il < shape->n_layer; il++)
            describe(m, il, ds4n_dec_layer_w(&m->base.wt, il), ds4n_dec_layer_wt(&m->base.wt, il),
                     hp);
    if (!m->layer || !m->scratch || !layers_valid(m)) {
        ds4n_dec_model_free(&m->base);
        return NULL;
    }
    return m;
}

int64_t ds4n_moe_decoder_expert_bytes(const ds4n_dec_model *m) {
    if (m->layers != layers) return -1;
    return ds4n_moe_expert_bytes(((const ds4n_moe_decoder *)m)->scratch);
}
