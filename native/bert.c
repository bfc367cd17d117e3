/* The BERT encoder forward passes, bert and nomic-bert (see bert.h). */
#include "bert.h"

#include <math.h>

#include "quants.h"

typedef struct bert {
    ds4n_dec_model base; /* first: the model is freed through it */
    ds4n_bert_hparams hp;
} bert;

/* out[r] = (x[r] - mean) / sqrt(var + eps) * w + b, for rows of n (out may be x); the
 * mean and variance in double, as the rows are short and the reference is float32. */
static void layer_norm(const float *x, const float *w, const float *bias, float *out,
                       int64_t rows, int n, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        float *o = out + r * n;
        double mean = 0.0, var = 0.0;
        for (int i = 0; i < n; i++) mean += xr[i];
        mean /= n;
        for (int i = 0; i < n; i++) var += ((double)xr[i] - mean) * ((double)xr[i] - mean);
        var /= n;
        const float inv = (float)(1.0 / sqrt(var + (double)eps));
        const float mu = (float)mean;
        for (int i = 0; i < n; i++) o[i] = (xr[i] - mu) * inv * w[i] + bias[i];
    }
}

static void add_bias(float *y, const float *bias, int64_t rows, int n) {
    for (int64_t r = 0; r < rows; r++)
        for (int i = 0; i < n; i++) y[r * n + i] += bias[i];
}

/* GELU as BERT defines it: x/2 * (1 + erf(x / sqrt 2)) (not the tanh approximation). */
static void gelu_erf(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.70710678118654752f));
}

static void embed_row(int32_t type, const void *table, int64_t row, int E, float *out) {
    const int64_t row_bytes = E / ds4n_type_block_size(type) * ds4n_type_block_bytes(type);
    ds4n_dequantize(type, (const char *)table + row * row_bytes, out, E);
}

static int layers(const ds4n_dec_model *base, ds4n_dec_batch *b, ds4n_pool *pool) {
    const bert *m = (const bert *)base;
    const ds4n_dec_shape *hp = &base->shape;
    const ds4n_dec_weights *wt = &base->wt;
    const int E = hp->n_embd, F = hp->n_ff;
    const int64_t T = b->n_rows;
    const float eps = hp->rms_eps;
    for (int i = 0; i < b->n_seq; i++)
        if (b->pos0[i] + b->count[i] > m->hp.n_pos) return DS4N_ERR_CONTEXT_FULL;
    /* The embedding rows (in b->x) plus token type 0 plus each row's position (one row of
     * scratch each in tmp and xn, which hold at least one row). */
    float *type0 = b->tmp, *pos = b->xn;
    embed_row(wt->type[DS4N_BERT_TOKEN_TYPES], wt->w[DS4N_BERT_TOKEN_TYPES], 0, E, type0);
    for (int i = 0; i < b->n_seq; i++)
        for (int64_t t = 0; t < b->count[i]; t++) {
            float *x = b->x + (b->row0[i] + t) * E;
            embed_row(wt->type[DS4N_BERT_POS_EMBD], wt->w[DS4N_BERT_POS_EMBD], b->pos0[i] + t,
                      E, pos);
            for (int k = 0; k < E; k++) x[k] = x[k] + type0[k] + pos[k];
        }
    layer_norm(b->x, wt->w[DS4N_BERT_EMBD_NORM], wt->w[DS4N_BERT_EMBD_NORM_B], b->x, T, E, eps);
    for (int il = 0; il < hp->n_layer; il++) {
        const void *const *lw = ds4n_dec_layer_w(wt, il);
        const int32_t *lt = ds4n_dec_layer_wt(wt, il);
        const ds4n_attn_layer al = {
            .wq = lw[DS4N_BERT_WQ], .tq = lt[DS4N_BERT_WQ],
            .wk = lw[DS4N_BERT_WK], .tk = lt[DS4N_BERT_WK],
            .wv = lw[DS4N_BERT_WV], .tv = lt[DS4N_BERT_WV],
            .wo = lw[DS4N_BERT_WO], .to = lt[DS4N_BERT_WO],
            .bq = lw[DS4N_BERT_BQ], .bk = lw[DS4N_BERT_BK],
            .bv = lw[DS4N_BERT_BV], .bo = lw[DS4N_BERT_BO],
            .rope = NULL, .q_scale = 1.0f / sqrtf((float)hp->head_dim),
        };
        ds4n_attention(&base->dims, &al, il, b, pool, b->x, b->tmp);
        ds4n_dec_add_rows(b->x, b->tmp, T * E);
        layer_norm(b->x, lw[DS4N_BERT_ATTN_NORM], lw[DS4N_BERT_ATTN_NORM_B], b->x, T, E, eps);

        float *up = b->ws->gate; /* T x n_ff: the workspace holds the FFN's width */
        ds4n_dec_project(pool, lt[DS4N_BERT_W_UP], lw[DS4N_BERT_W_UP], F, E, b->x, b->count,
                         b->n_seq, up);
        add_bias(up, lw[DS4N_BERT_B_UP], T, F);
        gelu_erf(up, T * F);
        ds4n_dec_project(pool, lt[DS4N_BERT_W_DOWN], lw[DS4N_BERT_W_DOWN], E, F, up, b->count,
                         b->n_seq, b->tmp);
        add_bias(b->tmp, lw[DS4N_BERT_B_DOWN], T, E);
        ds4n_dec_add_rows(b->x, b->tmp, T * E);
        layer_norm(b->x, lw[DS4N_BERT_OUT_NORM], lw[DS4N_BERT_OUT_NORM_B], b->x, T, E, eps);
    }
    return DS4N_OK;
}

ds4n_dec_model *ds4n_bert_new(const ds4n_bert_hparams *hp, const void *const *tensors,
                              const int32_t *types) {
    if (hp->shape.n_ff <= 0 || hp->shape.n_head_kv != hp->shape.n_head || hp->n_pos < 1 ||
        hp->n_token_types < 1 || !(hp->shape.rms_eps >= 0.0f))
        return NULL;
    static const int required_global[] = {DS4N_DEC_TOKEN_EMBD, DS4N_BERT_TOKEN_TYPES,
                                          DS4N_BERT_POS_EMBD, DS4N_BERT_EMBD_NORM,
                                          DS4N_BERT_EMBD_NORM_B};
    for (size_t i = 0; i < sizeof required_global / sizeof *required_global; i++)
        if (!tensors[required_global[i]]) return NULL;
    for (int il = 0; il < hp->shape.n_layer; il++)
        for (int s = 0; s < DS4N_BERT_N_PER_LAYER; s++)
            if (!tensors[DS4N_BERT_N_GLOBAL + (int64_t)il * DS4N_BERT_N_PER_LAYER + s]) return NULL;
    bert *m = ds4n_dec_model_new(sizeof *m, &hp->shape, DS4N_BERT_N_GLOBAL,
                                 DS4N_BERT_N_PER_LAYER, tensors, types, layers);
    if (!m) return NULL;
    m->hp = *hp;
    m->base.bidirectional = 1;
    return &m->base;
}

/* ---- nomic-bert ------------------------------------------------------------------------ */

typedef struct nomic_bert {
    ds4n_dec_model base; /* first: the model is freed through it */
    ds4n_nomic_bert_hparams hp;
    ds4n_rope rope;
} nomic_bert;

static int nomic_layers(const ds4n_dec_model *base, ds4n_dec_batch *b, ds4n_pool *pool) {
    const nomic_bert *m = (const nomic_bert *)base;
    const ds4n_dec_shape *hp = &base->shape;
    const ds4n_dec_weights *wt = &base->wt;
    const int E = hp->n_embd;
    const int64_t T = b->n_rows;
    const float eps = hp->rms_eps;
    if (wt->w[DS4N_NOMIC_TOKEN_TYPES]) { /* token type 0 on every row */
        float *type0 = b->tmp;
        embed_row(wt->type[DS4N_NOMIC_TOKEN_TYPES], wt->w[DS4N_NOMIC_TOKEN_TYPES], 0, E, type0);
        for (int64_t r = 0; r < T; r++)
            for (int k = 0; k < E; k++) b->x[r * E + k] += type0[k];
    }
    layer_norm(b->x, wt->w[DS4N_NOMIC_EMBD_NORM], wt->w[DS4N_NOMIC_EMBD_NORM_B], b->x, T, E,
               eps);
    for (int il = 0; il < hp->n_layer; il++) {
        const void *const *lw = ds4n_dec_layer_w(wt, il);
        const int32_t *lt = ds4n_dec_layer_wt(wt, il);
        const ds4n_attn_layer al = {
            .wqkv = lw[DS4N_NOMIC_WQKV], .tqkv = lt[DS4N_NOMIC_WQKV],
            .wq = lw[DS4N_NOMIC_WQ], .tq = lt[DS4N_NOMIC_WQ],
            .wk = lw[DS4N_NOMIC_WK], .tk = lt[DS4N_NOMIC_WK],
            .wv = lw[DS4N_NOMIC_WV], .tv = lt[DS4N_NOMIC_WV],
            .wo = lw[DS4N_NOMIC_WO], .to = lt[DS4N_NOMIC_WO],
            .rope = &m->rope, .q_scale = 1.0f / sqrtf((float)hp->head_dim),
        };
        ds4n_attention(&base->dims, &al, il, b, pool, b->x, b->tmp);
        ds4n_dec_add_rows(b->x, b->tmp, T * E);
        layer_norm(b->x, lw[DS4N_NOMIC_ATTN_NORM], lw[DS4N_NOMIC_ATTN_NORM_B], b->x, T, E, eps);
        const ds4n_ffn_layer fl = {
            .gate = lw[DS4N_NOMIC_W_GATE], .tgate = lt[DS4N_NOMIC_W_GATE],
            .up = lw[DS4N_NOMIC_W_UP], .tup = lt[DS4N_NOMIC_W_UP],
            .down = lw[DS4N_NOMIC_W_DOWN], .tdown = lt[DS4N_NOMIC_W_DOWN],
            .act = DS4N_ACT_SILU,
        };
        ds4n_ffn(&base->dims, &fl, b, pool, b->x, b->tmp);
        ds4n_dec_add_rows(b->x, b->tmp, T * E);
        layer_norm(b->x, lw[DS4N_NOMIC_OUT_NORM], lw[DS4N_NOMIC_OUT_NORM_B], b->x, T, E, eps);
    }
    return DS4N_OK;
}

ds4n_dec_model *ds4n_nomic_bert_new(const ds4n_nomic_bert_hparams *hp,
                                    const void *const *tensors, const int32_t *types) {
    if (hp->shape.n_ff <= 0 || hp->shape.n_head_kv != hp->shape.n_head ||
        hp->n_token_types < 0 || !(hp->shape.rms_eps >= 0.0f) ||
        (hp->n_token_types > 0) != (tensors[DS4N_NOMIC_TOKEN_TYPES] != NULL))
        return NULL;
    if (!tensors[DS4N_DEC_TOKEN_EMBD] || !tensors[DS4N_NOMIC_EMBD_NORM] ||
        !tensors[DS4N_NOMIC_EMBD_NORM_B])
        return NULL;
    for (int il = 0; il < hp->shape.n_layer; il++) {
        const void *const *lw = tensors + DS4N_NOMIC_N_GLOBAL + (int64_t)il * DS4N_NOMIC_N_PER_LAYER;
        const int split = lw[DS4N_NOMIC_WQ] && lw[DS4N_NOMIC_WK] && lw[DS4N_NOMIC_WV];
        const int any_split = lw[DS4N_NOMIC_WQ] || lw[DS4N_NOMIC_WK] || lw[DS4N_NOMIC_WV];
        if (lw[DS4N_NOMIC_WQKV] ? any_split : !split) return NULL;
        for (int s = DS4N_NOMIC_WO; s < DS4N_NOMIC_N_PER_LAYER; s++)
            if (!lw[s]) return NULL;
    }
    nomic_bert *m = ds4n_dec_model_new(sizeof *m, &hp->shape, DS4N_NOMIC_N_GLOBAL,
                                       DS4N_NOMIC_N_PER_LAYER, tensors, types, nomic_layers);
    if (!m) return NULL;
    m->hp = *hp;
    m->base.bidirectional = 1;
    const ds4n_rope_params rp = ds4n_dec_rope_params(&hp->shape, DS4N_ROPE_NEOX, NULL, NULL);
    if (ds4n_rope_init(&m->rope, &rp) != 0) {
        ds4n_dec_model_free(&m->base);
        return NULL;
    }
    return &m->base;
}
