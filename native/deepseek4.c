/* DeepSeek V4 Flash forward pass; see deepseek4.h.
 *
 * Layout of one eval (T tokens): for each layer, the dense projections run as batched
 * matmuls over the chunk; then a per-token loop pushes raw rows, steps the compressors,
 * runs the indexer and the sink attention against the cache as it stands after that
 * token; then the output projections and the MoE run batched again. Quantization
 * simulations (FP8 on KV rows, indexer Hadamard + FP4, F16 rounding of cached rows) are
 * part of the trained model and always on. */
#include "deepseek4.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h" /* ds4n_f32_to_f16 */
#include "quants.h"    /* ds4n_f16_to_f32 */
#include "steer.h"

#define NEG_INF (-1e30f)

struct tensor {
    const void *data;
    int type;
};

struct ds4n_dsv4_model {
    ds4n_dsv4_params p;
    int32_t *ratio;
    struct tensor g[DSV4_N_GLOBAL];
    struct tensor (*l)[DSV4_N_LAYER_SLOT];
};

struct frontier {
    float *kv, *score;
    int64_t rows, width;
};

struct layer_state {
    float *raw, *comp, *icomp;
    int64_t comp_cap, n_comp, n_icomp;
    struct frontier a, x; /* attention and indexer compressors */
};

struct ds4n_dsv4_state {
    const ds4n_dsv4_model *m; /* only while evaluating: the state may outlive the model */
    int n_layer;
    int64_t n_ctx, pos, raw_cap;
    struct layer_state *L;
    ds4n_steer *steer; /* steering of this state's sublayer outputs (steer.h), or NULL */
};

/* ---- numeric primitives ---------------------------------------------------------- */

/* The shared conversions (attention.h, quants.h): bitwise ds4's for every value but NaN,
 * whose payload bits may differ. */
static void f16_round(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = ds4n_f16_to_f32(ds4n_f32_to_f16(x[i]));
}

/* sum of squares in double, scale in float, as ds4 does (decoder.h's ds4n_rms_norm takes the
 * scale in double: other roundings, so it is not used here) */
static void rmsnorm(const float *x, const float *w, int64_t n, float eps, float *y) {
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float scale = 1.0f / sqrtf((float)(ss / (double)n) + eps);
    for (int64_t i = 0; i < n; i++) y[i] = w ? x[i] * scale * w[i] : x[i] * scale;
}

static float sigmoidf(float x) {
    if (x >= 0) return 1.0f / (1.0f + expf(-x));
    float e = expf(x);
    return e / (1.0f + e);
}

/* 2^ceil(log2(y)), exact for positive y */
static float pow2_ceil_log2(float y) {
    int e;
    float m = frexpf(y, &e);
    if (m == 0.5f) e--;
    return ldexpf(1.0f, e);
}

static float e4m3[127];
static const float fp4_values[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};

static void init_tables(void) {
    for (int i = 0; i < 127; i++) {
        int e = i >> 3, m = i & 7;
        e4m3[i] = e == 0 ? ldexpf((float)m, -9) : ldexpf(1.0f + m / 8.0f, e - 7);
    }
}

/* nearest table magnitude to |v|, ties to the even index, sign kept */
static float round_to_table(float v, const float *tab, int n) {
    float a = fabsf(v);
    int lo = 0, hi = n; /* first index with tab[i] >= a */
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (tab[mid] < a) lo = mid + 1; else hi = mid;
    }
    hi = lo < 1 ? 1 : lo > n - 1 ? n - 1 : lo;
    lo = hi - 1;
    float dlo = a - tab[lo], dhi = tab[hi] - a;
    int pick = dlo < dhi ? lo : dhi < dlo ? hi : (lo % 2 == 0 ? lo : hi);
    return copysignf(tab[pick], v);
}

static void block_sim(float *x, int64_t n, int64_t block, float range, float floor_amax,
                      const float *tab, int ntab) {
    for (int64_t b = 0; b < n; b += block) {
        float amax = 0;
        for (int64_t i = b; i < b + block; i++) amax = fmaxf(amax, fabsf(x[i]));
        float s = pow2_ceil_log2(fmaxf(amax, floor_amax) / range);
        for (int64_t i = b; i < b + block; i++) {
            float v = fminf(fmaxf(x[i] / s, -range), range);
            x[i] = round_to_table(v, tab, ntab) * s;
        }
    }
}

static void fp8sim(float *x, int64_t n) { block_sim(x, n, 64, 448.0f, 1e-4f, e4m3, 127); }

static void indexer_qat(float *x, int64_t n) {
    for (int64_t h = 1; h < n; h *= 2)
        for (int64_t i = 0; i < n; i += 2 * h)
            for (int64_t j = i; j < i + h; j++) {
                float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
    float s = (float)(1.0 / sqrt((double)n));
    for (int64_t i = 0; i < n; i++) x[i] *= s;
    block_sim(x, n, 32, 6.0f, 7.052966104933725e-38f, fp4_values, 8);
}

/* cos/sin of the n_rot/2 rotary pairs at pos; YaRN blend on compressed layers. Not
 * decoder.h's ds4n_rope: that keeps each pair's rate as a float and its YaRN ramp in float,
 * ds4 both in double (other angles), and it has no inverse rotation. */
static void rope_angles(const ds4n_dsv4_params *p, int64_t pos, int compressed, float *c, float *s) {
    int half = p->n_rot / 2;
    double base = compressed ? p->compress_rope_base : p->rope_base, low = 0, high = 0;
    if (compressed) {
        double k2 = 2 * log(base);
        low = floor(p->n_rot * log(p->rope_orig_ctx / (p->yarn_beta_fast * 2 * M_PI)) / k2);
        high = ceil(p->n_rot * log(p->rope_orig_ctx / (p->yarn_beta_slow * 2 * M_PI)) / k2);
        low = fmax(0.0, low);
        high = fmin(p->n_rot - 1.0, high);
    }
    for (int k = 0; k < half; k++) {
        double theta = (double)pos * pow(base, -2.0 * k / p->n_rot);
        if (compressed) {
            double t = (k - low) / fmax(0.001, high - low);
            double ramp = 1.0 - fmin(fmax(t, 0.0), 1.0);
            theta = theta / p->rope_scale * (1.0 - ramp) + theta * ramp;
        }
        c[k] = (float)cos(theta);
        s[k] = (float)sin(theta);
    }
}

/* rotates the last n_rot dims of each of n_rows rows of width hd (adjacent pairs) */
static void rope_tail(float *x, int64_t n_rows, int64_t hd, int n_rot, const float *c,
                      const float *s, int inverse) {
    for (int64_t r = 0; r < n_rows; r++) {
        float *t = x + r * hd + hd - n_rot;
        for (int k = 0; k < n_rot / 2; k++) {
            float x0 = t[2 * k], x1 = t[2 * k + 1], sk = inverse ? -s[k] : s[k];
            t[2 * k] = x0 * c[k] - x1 * sk;
            t[2 * k + 1] = x0 * sk + x1 * c[k];
        }
    }
}

/* ---- model ------------------------------------------------------------------------ */

static int64_t row_bytes(int type, int64_t n) {
    return n / ds4n_type_block_size(type) * ds4n_type_block_bytes(type);
}

static void matmul(ds4n_pool *pool, struct tensor t, int64_t rows, int64_t k, const float *x,
                   int64_t n, float *y) {
    ds4n_matmul(pool, t.type, t.data, rows, k, x, n, y);
}

/* row r (of width n) of a 2-D tensor, as float */
static void tensor_row(struct tensor t, int64_t r, int64_t n, float *dst) {
    ds4n_dequantize(t.type, (const char *)t.data + r * row_bytes(t.type, n), dst, n);
}

/* Bounds on every dimension: far above the released model, low enough that no size the
 * forward computes from them (chunk x heads x dims, capacities) can overflow int64. */
#define MAX_DIM (1 << 20)
#define MAX_LAYERS 4096

static int in_range(int64_t v, int64_t lo, int64_t hi) { return v >= lo && v <= hi; }

ds4n_dsv4_model *ds4n_dsv4_model_new(const ds4n_dsv4_params *p, const int32_t *ratios,
                                     int64_t n_ratios) {
    if (!p || !ratios || !in_range(p->n_layer, 1, MAX_LAYERS) || n_ratios != p->n_layer)
        return NULL;
    const int32_t dims[] = {p->n_embd, p->n_vocab, p->n_head, p->head_dim, p->q_lora_rank,
                            p->o_lora_rank, p->o_groups, p->n_expert, p->n_ff_exp, p->window,
                            p->idx_n_head, p->idx_head_dim, p->idx_top_k, p->rope_orig_ctx};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        if (!in_range(dims[i], 1, MAX_DIM)) return NULL;
    /* fixed-size arrays in the forward: mix[16], pre[16], best[64], rope c/s[64] */
    if (!in_range(p->n_hc, 1, 16) || !in_range(p->n_expert_used, 1, 64) ||
        p->n_expert_used > p->n_expert || !in_range(p->n_rot, 2, 128) || p->n_rot % 2 ||
        p->head_dim <= p->n_rot || p->idx_head_dim < p->n_rot || p->n_head % p->o_groups ||
        !in_range(p->n_hash_layer, 0, p->n_layer) || !in_range(p->sinkhorn_iters, 0, 1000))
        return NULL;
    for (int il = 0; il < p->n_layer; il++)
        if (ratios[il] != 0 && ratios[il] != 4 && ratios[il] != 128) return NULL;
    init_tables();
    ds4n_dsv4_model *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->p = *p;
    m->ratio = malloc(sizeof(int32_t) * p->n_layer);
    m->l = calloc((size_t)p->n_layer, sizeof *m->l);
    if (!m->ratio || !m->l) {
        ds4n_dsv4_model_free(m);
        return NULL;
    }
    memcpy(m->ratio, ratios, sizeof(int32_t) * p->n_layer);
    return m;
}

void ds4n_dsv4_model_free(ds4n_dsv4_model *m) {
    if (!m) return;
    free(m->ratio);
    free(m->l);
    free(m);
}

/* What a slot holds: float vectors read in place, matrices the kernels read (any type
 * they support), and the int32 hash-routing table. */
enum slot_kind { SLOT_UNUSED, SLOT_F32, SLOT_MATRIX, SLOT_I32 };

/* The kind and shape (rows of ne0 values) of a slot in layer il (-1: global). */
static enum slot_kind slot_shape(const ds4n_dsv4_model *m, int il, int slot, int64_t *ne0,
                                 int64_t *rows) {
    const ds4n_dsv4_params *p = &m->p;
    int64_t E = p->n_embd, hd = p->head_dim, ihd = p->idx_head_dim, nh = p->n_hc;
    int64_t hc = nh * E, mixn = 2 * nh + nh * nh, G = p->o_groups, olr = p->o_lora_rank;
    int64_t qlr = p->q_lora_rank, ff = p->n_ff_exp, nE = p->n_expert;
    int r = il < 0 ? 0 : m->ratio[il];
    int64_t W = (r == 4 ? 2 : 1) * hd;
#define V(n) (*ne0 = (n), *rows = 1, SLOT_F32)
#define M(r_, k_) (*ne0 = (k_), *rows = (r_), SLOT_MATRIX)
    if (il < 0) switch (slot) {
        case DSV4_TOKEN_EMBD: return M(p->n_vocab, E);
        case DSV4_OUT_HC_BASE: return V(nh);
        case DSV4_OUT_HC_FN: return M(nh, hc);
        case DSV4_OUT_HC_SCALE: return V(1);
        case DSV4_OUT_NORM: return V(E);
        case DSV4_OUTPUT: return M(p->n_vocab, E);
        default: return SLOT_UNUSED;
        }
    switch (slot) {
    case DSV4_HC_ATTN_FN: case DSV4_HC_FFN_FN: return M(mixn, hc);
    case DSV4_HC_ATTN_SCALE: case DSV4_HC_FFN_SCALE: return V(3);
    case DSV4_HC_ATTN_BASE: case DSV4_HC_FFN_BASE: return V(mixn);
    case DSV4_ATTN_NORM: case DSV4_FFN_NORM: return V(E);
    case DSV4_Q_A: return M(qlr, E);
    case DSV4_Q_A_NORM: return V(qlr);
    case DSV4_Q_B: return M(p->n_head * hd, qlr);
    case DSV4_KV: return M(hd, E);
    case DSV4_KV_NORM: return V(hd);
    case DSV4_SINKS: return V(p->n_head);
    case DSV4_OUT_A: return M(G * olr, p->n_head / G * hd);
    case DSV4_OUT_B: return M(E, G * olr);
    case DSV4_CMP_APE: return r ? M(r, W) : SLOT_UNUSED;
    case DSV4_CMP_KV: case DSV4_CMP_GATE: return r ? M(W, E) : SLOT_UNUSED;
    case DSV4_CMP_NORM: return r ? V(hd) : SLOT_UNUSED;
    case DSV4_IDX_Q_B: return r == 4 ? M(p->idx_n_head * ihd, qlr) : SLOT_UNUSED;
    case DSV4_IDX_PROJ: return r == 4 ? M(p->idx_n_head, E) : SLOT_UNUSED;
    case DSV4_IDX_CMP_APE: return r == 4 ? M(4, 2 * ihd) : SLOT_UNUSED;
    case DSV4_IDX_CMP_KV: case DSV4_IDX_CMP_GATE: return r == 4 ? M(2 * ihd, E) : SLOT_UNUSED;
    case DSV4_IDX_CMP_NORM: return r == 4 ? V(ihd) : SLOT_UNUSED;
    case DSV4_GATE_INP: return M(nE, E);
    case DSV4_EXP_BIAS: return V(nE);
    case DSV4_GATE_EXPS: case DSV4_UP_EXPS: return M(ff * nE, E);
    case DSV4_DOWN_EXPS: return M(E * nE, ff);
    case DSV4_GATE_SH: case DSV4_UP_SH: return M(ff, E);
    case DSV4_DOWN_SH: return M(E, ff);
    case DSV4_TID2EID:
        if (il >= p->n_hash_layer) return SLOT_UNUSED;
        *ne0 = p->n_expert_used;
        *rows = p->n_vocab;
        return SLOT_I32;
    default: return SLOT_UNUSED;
    }
#undef V
#undef M
}

int ds4n_dsv4_set_tensor(ds4n_dsv4_model *m, int il, int slot, const void *data, int type,
                         int64_t n_bytes) {
    if (!m || !data || il < -1 || il >= m->p.n_layer || slot < 0 ||
        slot >= (il < 0 ? DSV4_N_GLOBAL : DSV4_N_LAYER_SLOT))
        return DSV4_ERR_ARG;
    int64_t ne0 = 0, rows = 0, want;
    switch (slot_shape(m, il, slot, &ne0, &rows)) {
    case SLOT_UNUSED: return DSV4_ERR_ARG;
    case SLOT_F32:
        if (type != DS4N_F32) return DSV4_ERR_TENSOR;
        want = rows * ne0 * (int64_t)sizeof(float);
        break;
    case SLOT_I32:
        if (type != 26) return DSV4_ERR_TENSOR; /* GGML_TYPE_I32 */
        want = rows * ne0 * (int64_t)sizeof(int32_t);
        break;
    default:
        if (!ds4n_type_supported(type) || ne0 % ds4n_type_block_size(type)) return DSV4_ERR_TENSOR;
        want = rows * row_bytes(type, ne0);
    }
    if (n_bytes != want) return DSV4_ERR_TENSOR;
    if (il < 0) m->g[slot] = (struct tensor){data, type};
    else m->l[il][slot] = (struct tensor){data, type};
    return DSV4_OK;
}

/* ---- state ------------------------------------------------------------------------ */

static int64_t frontier_rows(int ratio) { return ratio == 4 ? 8 : ratio; }

static void frontier_clear(struct frontier *f) {
    int64_t n = f->rows * f->width;
    for (int64_t i = 0; i < n; i++) {
        f->kv[i] = 0;
        f->score[i] = NEG_INF;
    }
}

void ds4n_dsv4_state_free(ds4n_dsv4_state *st) {
    if (!st) return;
    for (int il = 0; st->L && il < st->n_layer; il++) {
        struct layer_state *ls = &st->L[il];
        free(ls->raw);
        free(ls->comp);
        free(ls->icomp);
        free(ls->a.kv);
        free(ls->a.score);
        free(ls->x.kv);
        free(ls->x.score);
    }
    free(st->L);
    free(st);
}

void ds4n_dsv4_state_reset(ds4n_dsv4_state *st) {
    if (!st) return;
    st->pos = 0;
    for (int il = 0; il < st->n_layer; il++) {
        struct layer_state *ls = &st->L[il];
        ls->n_comp = ls->n_icomp = 0;
        if (ls->a.rows) frontier_clear(&ls->a);
        if (ls->x.rows) frontier_clear(&ls->x);
    }
}

ds4n_dsv4_state *ds4n_dsv4_state_new(const ds4n_dsv4_model *m, int64_t n_ctx) {
    /* the bound keeps every capacity product (rows x head_dim) far from overflow */
    if (!m || n_ctx <= 0 || n_ctx > ((int64_t)1 << 32)) return NULL;
    const ds4n_dsv4_params *p = &m->p;
    ds4n_dsv4_state *st = calloc(1, sizeof *st);
    if (!st) return NULL;
    st->m = m;
    st->n_layer = p->n_layer;
    st->n_ctx = n_ctx;
    st->raw_cap = n_ctx < p->window ? n_ctx : p->window;
    st->L = calloc((size_t)p->n_layer, sizeof *st->L);
    if (!st->L) goto fail;
    for (int il = 0; il < p->n_layer; il++) {
        struct layer_state *ls = &st->L[il];
        int r = m->ratio[il];
        ls->raw = calloc((size_t)(st->raw_cap * p->head_dim), sizeof(float));
        if (!ls->raw) goto fail;
        if (!r) continue;
        ls->comp_cap = n_ctx / r + 2;
        ls->comp = calloc((size_t)(ls->comp_cap * p->head_dim), sizeof(float));
        ls->a.rows = frontier_rows(r);
        ls->a.width = (r == 4 ? 2 : 1) * (int64_t)p->head_dim;
        ls->a.kv = malloc(sizeof(float) * ls->a.rows * ls->a.width);
        ls->a.score = malloc(sizeof(float) * ls->a.rows * ls->a.width);
        if (!ls->comp || !ls->a.kv || !ls->a.score) goto fail;
        if (r != 4) continue;
        ls->icomp = calloc((size_t)(ls->comp_cap * p->idx_head_dim), sizeof(float));
        ls->x.rows = 8;
        ls->x.width = 2 * (int64_t)p->idx_head_dim;
        ls->x.kv = malloc(sizeof(float) * ls->x.rows * ls->x.width);
        ls->x.score = malloc(sizeof(float) * ls->x.rows * ls->x.width);
        if (!ls->icomp || !ls->x.kv || !ls->x.score) goto fail;
    }
    ds4n_dsv4_state_reset(st);
    return st;
fail:
    ds4n_dsv4_state_free(st);
    return NULL;
}

int64_t ds4n_dsv4_state_pos(const ds4n_dsv4_state *st) { return st ? st->pos : 0; }

int ds4n_dsv4_state_layer(ds4n_dsv4_state *st, int il, ds4n_dsv4_layer_state *out) {
    if (!st || !out || il < 0 || il >= st->n_layer) return DSV4_ERR_ARG;
    struct layer_state *ls = &st->L[il];
    *out = (ds4n_dsv4_layer_state){
        .raw = ls->raw, .comp = ls->comp, .icomp = ls->icomp,
        .attn_kv = ls->a.kv, .attn_score = ls->a.score, .idx_kv = ls->x.kv, .idx_score = ls->x.score,
        .raw_cap = st->raw_cap, .comp_cap = ls->comp_cap, .n_comp = ls->n_comp, .n_icomp = ls->n_icomp,
        .attn_rows = ls->a.rows, .attn_width = ls->a.width, .idx_rows = ls->x.rows, .idx_width = ls->x.width,
        .ratio = st->m->ratio[il], .head_dim = st->m->p.head_dim, .idx_head_dim = st->m->p.idx_head_dim,
    };
    return DSV4_OK;
}

int ds4n_dsv4_state_restore(ds4n_dsv4_state *st, int64_t n_pos, const int64_t *n_comp,
                            const int64_t *n_icomp, int64_t n_layers) {
    if (!st || !n_comp || !n_icomp || n_layers != st->n_layer) return DSV4_ERR_ARG;
    if (n_pos < 0 || n_pos > st->n_ctx) return DSV4_ERR_ARG;
    for (int il = 0; il < st->n_layer; il++) {
        struct layer_state *ls = &st->L[il];
        int64_t nc = ls->comp ? n_comp[il] : 0, ni = ls->icomp ? n_icomp[il] : 0;
        if (nc < 0 || nc > ls->comp_cap || ni < 0 || ni > ls->comp_cap) return DSV4_ERR_ARG;
        if (!ls->comp && n_comp[il]) return DSV4_ERR_ARG;
        if (!ls->icomp && n_icomp[il]) return DSV4_ERR_ARG;
    }
    for (int il = 0; il < st->n_layer; il++) {
        st->L[il].n_comp = st->L[il].comp ? n_comp[il] : 0;
        st->L[il].n_icomp = st->L[il].icomp ? n_icomp[il] : 0;
    }
    st->pos = n_pos;
    return DSV4_OK;
}

/* ---- forward pieces ------------------------------------------------------------- */

struct ranked { float score; int32_t index; };

/* Scratch for one eval, sized for T tokens. */
struct scratch {
    ds4n_steer *steer; /* the state's, applied to each sublayer output o before hc_post */
    float *X;       /* T x n_hc x E: residual streams */
    float *flat;    /* T x hc_dim: normalised streams */
    float *mix;     /* T x hc_mix */
    float *hpost;   /* T x n_hc */
    float *hcomb;   /* T x n_hc x n_hc */
    float *cur;     /* T x E: sublayer input */
    float *xn;      /* T x E */
    float *qr;      /* T x q_lora */
    float *q;       /* T x n_head*hd */
    float *kv;      /* T x hd */
    float *ckv, *cgate;   /* T x 2hd: attention compressor projections */
    float *ikv, *igate;   /* T x 2ihd: indexer compressor projections */
    float *iq;            /* T x idx_heads*ihd */
    float *iw;            /* T x idx_heads */
    float *att;           /* T x n_head*hd: attention output */
    float *grp;           /* T x hpg*hd: one group's heads */
    float *low, *glow;    /* T x o_groups*o_lora, T x o_lora */
    float *o;             /* T x E */
    float *rlogit;        /* T x n_expert */
    int32_t *sel;         /* T x n_used */
    float *selw;          /* T x n_used */
    float *ye;            /* T x n_used x E: each routed expert's output */
    float *ebuf, *eg, *eu; /* T x E, T x ff, T x ff */
    int32_t *etok;        /* T */
    float *rows;          /* max_rows x hd: the rows one token attends to */
    float *scores;        /* n_head x max_rows */
    float *ctmp;          /* 2 x (hd + ihd): compressor pooling */
    float *iscores;       /* idx_n_head x idx_rows: indexer dot products */
    struct ranked *rank;  /* idx_rows */
    uint8_t *mask;        /* idx_rows */
    void *block;
};

static int scratch_alloc(struct scratch *s, const ds4n_dsv4_model *m, const ds4n_dsv4_state *st, int64_t T) {
    const ds4n_dsv4_params *p = &m->p;
    int64_t E = p->n_embd, hd = p->head_dim, ihd = p->idx_head_dim, nh = p->n_hc;
    int64_t mixn = 2 * nh + nh * nh, hpg = p->n_head / p->o_groups;
    /* visible compressed rows: all of a ratio-128 layer, at most top_k of a ratio-4 one */
    int64_t vis_max = 0, idx_rows = 1;
    for (int il = 0; il < p->n_layer; il++) {
        int64_t cap = st->L[il].comp_cap;
        if (m->ratio[il] == 4) {
            if (cap > idx_rows) idx_rows = cap;
            if (cap > p->idx_top_k) cap = p->idx_top_k;
        }
        if (cap > vis_max) vis_max = cap;
    }
    int64_t max_rows = st->raw_cap + vis_max;
    int64_t ff = p->n_ff_exp > E ? p->n_ff_exp : E;
    struct { float **ptr; int64_t n; } f[] = {
        {&s->X, T * nh * E}, {&s->flat, T * nh * E}, {&s->mix, T * mixn}, {&s->hpost, T * nh},
        {&s->hcomb, T * nh * nh}, {&s->cur, T * E}, {&s->xn, T * E}, {&s->qr, T * p->q_lora_rank},
        {&s->q, T * p->n_head * hd}, {&s->kv, T * hd}, {&s->ckv, T * 2 * hd}, {&s->cgate, T * 2 * hd},
        {&s->ikv, T * 2 * ihd}, {&s->igate, T * 2 * ihd}, {&s->iq, T * p->idx_n_head * ihd},
        {&s->iw, T * p->idx_n_head}, {&s->att, T * p->n_head * hd}, {&s->grp, T * hpg * hd},
        {&s->low, T * p->o_groups * p->o_lora_rank}, {&s->glow, T * p->o_lora_rank}, {&s->o, T * E},
        {&s->rlogit, T * p->n_expert}, {&s->selw, T * p->n_expert_used},
        {&s->ye, T * p->n_expert_used * E}, {&s->ebuf, T * E}, {&s->eg, T * ff}, {&s->eu, T * ff},
        {&s->rows, max_rows * hd}, {&s->scores, p->n_head * max_rows},
        {&s->ctmp, 2 * (hd + ihd)}, {&s->iscores, p->idx_n_head * idx_rows},
    };
    size_t nf = sizeof f / sizeof f[0], total = 0;
    for (size_t i = 0; i < nf; i++) total += (size_t)f[i].n * sizeof(float);
    size_t ranks = (size_t)idx_rows * sizeof(struct ranked);
    size_t ints = (size_t)(T * p->n_expert_used + T) * sizeof(int32_t);
    s->block = malloc(total + ranks + ints + (size_t)idx_rows);
    if (!s->block) return -1;
    char *c = s->block;
    for (size_t i = 0; i < nf; i++) {
        *f[i].ptr = (float *)c;
        c += (size_t)f[i].n * sizeof(float);
    }
    s->rank = (struct ranked *)c;
    c += ranks;
    s->sel = (int32_t *)c;
    s->etok = s->sel + T * p->n_expert_used;
    s->mask = (uint8_t *)(s->etok + T);
    return 0;
}

/* HC pre for all T tokens: the sublayer inputs (cur), post gates and Sinkhorn combs. */
static void hc_pre(const ds4n_dsv4_model *m, ds4n_pool *pool, struct scratch *s, int64_t T,
                   struct tensor fn, const float *scale, const float *base) {
    const ds4n_dsv4_params *p = &m->p;
    int nh = p->n_hc;
    int64_t E = p->n_embd, hc = nh * E, mixn = 2 * nh + nh * nh;
    for (int64_t t = 0; t < T; t++) rmsnorm(s->X + t * hc, NULL, hc, p->rms_eps, s->flat + t * hc);
    matmul(pool, fn, mixn, hc, s->flat, T, s->mix);
    float eps = p->hc_eps;
    for (int64_t t = 0; t < T; t++) {
        const float *mix = s->mix + t * mixn, *X = s->X + t * hc;
        float pre[16], *post = s->hpost + t * nh, *C = s->hcomb + t * nh * nh;
        for (int i = 0; i < nh; i++) {
            pre[i] = sigmoidf(mix[i] * scale[0] + base[i]) + eps;
            post[i] = 2 * sigmoidf(mix[nh + i] * scale[1] + base[nh + i]);
        }
        for (int i = 0; i < nh * nh; i++) C[i] = mix[2 * nh + i] * scale[2] + base[2 * nh + i];
        for (int i = 0; i < nh; i++) { /* rows: softmax + eps */
            float mx = C[i * nh], sum = 0;
            for (int j = 1; j < nh; j++) mx = fmaxf(mx, C[i * nh + j]);
            for (int j = 0; j < nh; j++) sum += (C[i * nh + j] = expf(C[i * nh + j] - mx));
            for (int j = 0; j < nh; j++) C[i * nh + j] = C[i * nh + j] / sum + eps;
        }
        for (int it = 0; it < p->sinkhorn_iters; it++) {
            if (it > 0)
                for (int i = 0; i < nh; i++) {
                    float sum = 0;
                    for (int j = 0; j < nh; j++) sum += C[i * nh + j];
                    for (int j = 0; j < nh; j++) C[i * nh + j] /= sum + eps;
                }
            for (int j = 0; j < nh; j++) {
                float sum = 0;
                for (int i = 0; i < nh; i++) sum += C[i * nh + j];
                for (int i = 0; i < nh; i++) C[i * nh + j] /= sum + eps;
            }
        }
        float *y = s->cur + t * E;
        for (int64_t k = 0; k < E; k++) y[k] = pre[0] * X[k];
        for (int i = 1; i < nh; i++)
            for (int64_t k = 0; k < E; k++) y[k] += pre[i] * X[i * E + k];
    }
}

/* X[j] = post[j] * o + sum_i C[i][j] X[i] for every token */
static void hc_post(const ds4n_dsv4_model *m, struct scratch *s, int64_t T) {
    int nh = m->p.n_hc;
    int64_t E = m->p.n_embd;
    float old[16];
    for (int64_t t = 0; t < T; t++) {
        float *X = s->X + t * nh * E;
        const float *o = s->o + t * E, *post = s->hpost + t * nh, *C = s->hcomb + t * nh * nh;
        for (int64_t k = 0; k < E; k++) {
            for (int i = 0; i < nh; i++) old[i] = X[i * E + k];
            for (int j = 0; j < nh; j++) {
                float acc = 0;
                for (int i = 0; i < nh; i++) acc += C[i * nh + j] * old[i];
                X[j * E + k] = post[j] * o[k] + acc;
            }
        }
    }
}

/* One compressor step for one token; returns 1 and writes row (hd) when a block closes. */
static int compress_step(const ds4n_dsv4_params *p, struct frontier *f, int ratio, int64_t hd,
                         struct tensor ape, const float *norm, const float *kvc, const float *scc,
                         int64_t pos, float *row, float *tmp) {
    int64_t W = f->width, slot = ratio == 4 ? 4 + pos % 4 : pos % ratio;
    tensor_row(ape, pos % ratio, W, tmp);
    for (int64_t j = 0; j < W; j++) {
        f->kv[slot * W + j] = kvc[j];
        f->score[slot * W + j] = scc[j] + tmp[j];
    }
    if ((pos + 1) % ratio) return 0;
    int64_t n = ratio == 4 ? 8 : ratio;
    for (int64_t j = 0; j < hd; j++) {
        /* ratio 4: rows 0..3 (previous window) use column j, rows 4..7 column hd + j */
#define COL(r) ((r) * W + (ratio == 4 && (r) >= 4 ? hd + j : j))
        float mx = NEG_INF;
        for (int64_t r = 0; r < n; r++) mx = fmaxf(mx, f->score[COL(r)]);
        float num = 0, den = 0;
        for (int64_t r = 0; r < n; r++) {
            float e = expf(f->score[COL(r)] - mx);
            num += e * f->kv[COL(r)];
            den += e;
        }
#undef COL
        tmp[j] = mx <= -5e29f ? 0.0f : num / den;
    }
    rmsnorm(tmp, norm, hd, p->rms_eps, row);
    float c[64], s[64];
    rope_angles(p, pos + 1 - ratio, 1, c, s);
    rope_tail(row, 1, hd, p->n_rot, c, s, 0);
    if (ratio == 4) {
        memcpy(f->kv, f->kv + 4 * W, sizeof(float) * 4 * W);
        memcpy(f->score, f->score + 4 * W, sizeof(float) * 4 * W);
    }
    return 1;
}

static int by_score_desc(const void *a, const void *b) {
    const struct ranked *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

/* Softmax over [sink, scores] and the weighted sum of the rows, for a share of heads. */
struct sink_softmax {
    const float *rows;
    float *scores; /* n_head x n_rows, unscaled dots */
    const float *sinks;
    float *out; /* n_head x hd */
    int64_t n_rows, hd, n_head;
    float scale;
};

static void sink_softmax_heads(void *ctx, int ith, int nth) {
    const struct sink_softmax *j = ctx;
    for (int64_t h = ith; h < j->n_head; h += nth) {
        float *sc = j->scores + h * j->n_rows, mx = j->sinks[h];
        for (int64_t r = 0; r < j->n_rows; r++) {
            sc[r] *= j->scale;
            mx = fmaxf(mx, sc[r]);
        }
        float den = 0, *oh = j->out + h * j->hd;
        memset(oh, 0, sizeof(float) * j->hd);
        for (int64_t r = 0; r < j->n_rows; r++) {
            float e = expf(sc[r] - mx);
            const float *row = j->rows + r * j->hd;
            den += e;
            for (int64_t k = 0; k < j->hd; k++) oh[k] += e * row[k];
        }
        den += expf(j->sinks[h] - mx);
        for (int64_t k = 0; k < j->hd; k++) oh[k] /= den;
    }
}

/* Attention sublayer for one layer over the chunk. */
static int attention(const ds4n_dsv4_model *m, ds4n_dsv4_state *st, ds4n_pool *pool,
                     struct scratch *s, int il, int64_t T, int64_t pos0) {
    const ds4n_dsv4_params *p = &m->p;
    const struct tensor *w = m->l[il];
    struct layer_state *ls = &st->L[il];
    int r = m->ratio[il];
    int64_t E = p->n_embd, hd = p->head_dim, ihd = p->idx_head_dim, nH = p->n_head;
    int64_t qlr = p->q_lora_rank, nope = hd - p->n_rot;

    hc_pre(m, pool, s, T, w[DSV4_HC_ATTN_FN], w[DSV4_HC_ATTN_SCALE].data, w[DSV4_HC_ATTN_BASE].data);
    for (int64_t t = 0; t < T; t++)
        rmsnorm(s->cur + t * E, w[DSV4_ATTN_NORM].data, E, p->rms_eps, s->xn + t * E);
    matmul(pool, w[DSV4_Q_A], qlr, E, s->xn, T, s->qr);
    for (int64_t t = 0; t < T; t++)
        rmsnorm(s->qr + t * qlr, w[DSV4_Q_A_NORM].data, qlr, p->rms_eps, s->qr + t * qlr);
    matmul(pool, w[DSV4_Q_B], nH * hd, qlr, s->qr, T, s->q);
    matmul(pool, w[DSV4_KV], hd, E, s->xn, T, s->kv);
    if (r) {
        int64_t W = (r == 4 ? 2 : 1) * hd;
        matmul(pool, w[DSV4_CMP_KV], W, E, s->xn, T, s->ckv);
        matmul(pool, w[DSV4_CMP_GATE], W, E, s->xn, T, s->cgate);
    }
    if (r == 4) {
        matmul(pool, w[DSV4_IDX_CMP_KV], 2 * ihd, E, s->xn, T, s->ikv);
        matmul(pool, w[DSV4_IDX_CMP_GATE], 2 * ihd, E, s->xn, T, s->igate);
        matmul(pool, w[DSV4_IDX_Q_B], p->idx_n_head * ihd, qlr, s->qr, T, s->iq);
        matmul(pool, w[DSV4_IDX_PROJ], p->idx_n_head, E, s->xn, T, s->iw);
    }
    const float *sinks = w[DSV4_SINKS].data;
    float inv_sqrt = (float)(1.0 / sqrt((double)hd));
    for (int64_t t = 0; t < T; t++) {
        int64_t pos = pos0 + t;
        float c[64], sn[64];
        rope_angles(p, pos, r != 0, c, sn);
        float *q = s->q + t * nH * hd;
        for (int64_t h = 0; h < nH; h++) rmsnorm(q + h * hd, NULL, hd, p->rms_eps, q + h * hd);
        rope_tail(q, nH, hd, p->n_rot, c, sn, 0);

        float *kv = s->kv + t * hd, *raw = ls->raw + (pos % st->raw_cap) * hd;
        rmsnorm(kv, w[DSV4_KV_NORM].data, hd, p->rms_eps, raw);
        rope_tail(raw, 1, hd, p->n_rot, c, sn, 0);
        fp8sim(raw, nope);
        f16_round(raw, hd);

        if (r) {
            int64_t W = (r == 4 ? 2 : 1) * hd;
            float *row = ls->comp + ls->n_comp * hd;
            if (compress_step(p, &ls->a, r, hd, w[DSV4_CMP_APE], w[DSV4_CMP_NORM].data,
                              s->ckv + t * W, s->cgate + t * W, pos, row, s->ctmp)) {
                fp8sim(row, nope);
                f16_round(row, hd);
                ls->n_comp++;
            }
        }
        int select = 0;
        if (r == 4) {
            float *row = ls->icomp + ls->n_icomp * ihd;
            if (compress_step(p, &ls->x, 4, ihd, w[DSV4_IDX_CMP_APE], w[DSV4_IDX_CMP_NORM].data,
                              s->ikv + t * 2 * ihd, s->igate + t * 2 * ihd, pos, row, s->ctmp)) {
                indexer_qat(row, ihd);
                f16_round(row, ihd);
                ls->n_icomp++;
            }
            if (ls->n_icomp > p->idx_top_k) { /* lightning indexer: top-k compressed rows */
                int64_t nih = p->idx_n_head, n = ls->n_icomp;
                float *iq = s->iq + t * nih * ihd, *iw = s->iw + t * nih;
                rope_tail(iq, nih, ihd, p->n_rot, c, sn, 0);
                for (int64_t h = 0; h < nih; h++) indexer_qat(iq + h * ihd, ihd);
                float wscale = (float)(1.0 / sqrt((double)(ihd * nih)));
                struct ranked *rk = s->rank;
                /* iscores[h][c] = iq_h . icomp_c */
                ds4n_matmul(pool, DS4N_F32, ls->icomp, n, ihd, iq, nih, s->iscores);
                for (int64_t ci = 0; ci < n; ci++) {
                    float sc = 0;
                    for (int64_t h = 0; h < nih; h++)
                        sc += fmaxf(s->iscores[h * n + ci], 0.0f) * (iw[h] * wscale);
                    rk[ci] = (struct ranked){sc, (int32_t)ci};
                }
                qsort(rk, (size_t)n, sizeof *rk, by_score_desc);
                memset(s->mask, 0, (size_t)n);
                for (int64_t k = 0; k < p->idx_top_k; k++) s->mask[rk[k].index] = 1;
                select = 1;
            }
        }
        /* gather the visible rows: raw window (oldest first), then compressed rows */
        int64_t n_raw = pos + 1 < st->raw_cap ? pos + 1 : st->raw_cap, nr = 0;
        for (int64_t pp = pos + 1 - n_raw; pp <= pos; pp++, nr++)
            memcpy(s->rows + nr * hd, ls->raw + (pp % st->raw_cap) * hd, sizeof(float) * hd);
        for (int64_t ci = 0; ci < ls->n_comp; ci++)
            if (!select || s->mask[ci])
                memcpy(s->rows + nr++ * hd, ls->comp + ci * hd, sizeof(float) * hd);
        float *out = s->att + t * nH * hd;
        /* scores[h][j] = q_h . row_j for all heads at once, then softmax and values */
        ds4n_matmul(pool, DS4N_F32, s->rows, nr, hd, q, nH, s->scores);
        struct sink_softmax job = {s->rows, s->scores, sinks, out, nr, hd, nH, inv_sqrt};
        if (pool) ds4n_pool_run(pool, sink_softmax_heads, &job);
        else sink_softmax_heads(&job, 0, 1);
        rope_tail(out, nH, hd, p->n_rot, c, sn, 1);
    }
    /* grouped output projection, then the shared down-projection */
    int64_t hpg = nH / p->o_groups, olr = p->o_lora_rank, G = p->o_groups;
    for (int64_t g = 0; g < G; g++) {
        for (int64_t t = 0; t < T; t++)
            memcpy(s->grp + t * hpg * hd, s->att + t * nH * hd + g * hpg * hd, sizeof(float) * hpg * hd);
        struct tensor wa = w[DSV4_OUT_A];
        wa.data = (const char *)wa.data + g * olr * row_bytes(wa.type, hpg * hd);
        matmul(pool, wa, olr, hpg * hd, s->grp, T, s->glow);
        for (int64_t t = 0; t < T; t++)
            memcpy(s->low + t * G * olr + g * olr, s->glow + t * olr, sizeof(float) * olr);
    }
    matmul(pool, w[DSV4_OUT_B], E, G * olr, s->low, T, s->o);
    ds4n_steer_rows(s->steer, il, DS4N_STEER_ATTN, s->o, T);
    hc_post(m, s, T);
    return 0;
}

static float softplusf(float x) { return x > 20 ? x : x < -20 ? expf(x) : log1pf(expf(x)); }
static float siluf(float x) { return x * sigmoidf(x); }

/* Clamped, and weighted before the down projection. Not attention.h's ds4n_swiglu (silu as
 * g / (1 + exp(-g)), SIMD kernels) nor moe.h's activations: other roundings. */
static void swiglu(const float *g, const float *u, float wgt, float clamp, int64_t n, float *mid) {
    for (int64_t i = 0; i < n; i++) {
        float gv = fminf(g[i], clamp), uv = fminf(fmaxf(u[i], -clamp), clamp);
        mid[i] = siluf(gv) * uv * wgt;
    }
}

static void ffn(const ds4n_dsv4_model *m, ds4n_pool *pool, struct scratch *s, int il,
                const int32_t *tokens, int64_t T) {
    const ds4n_dsv4_params *p = &m->p;
    const struct tensor *w = m->l[il];
    int64_t E = p->n_embd, ff = p->n_ff_exp, nE = p->n_expert, K = p->n_expert_used;
    hc_pre(m, pool, s, T, w[DSV4_HC_FFN_FN], w[DSV4_HC_FFN_SCALE].data, w[DSV4_HC_FFN_BASE].data);
    for (int64_t t = 0; t < T; t++)
        rmsnorm(s->cur + t * E, w[DSV4_FFN_NORM].data, E, p->rms_eps, s->xn + t * E);
    matmul(pool, w[DSV4_GATE_INP], nE, E, s->xn, T, s->rlogit);
    const float *bias = w[DSV4_EXP_BIAS].data;
    for (int64_t t = 0; t < T; t++) {
        float *pr = s->rlogit + t * nE, *wt = s->selw + t * K;
        int32_t *sel = s->sel + t * K;
        for (int64_t e = 0; e < nE; e++) pr[e] = sqrtf(softplusf(pr[e]));
        if (il < p->n_hash_layer) {
            const int32_t *tid = w[DSV4_TID2EID].data;
            for (int64_t k = 0; k < K; k++) sel[k] = tid[(int64_t)tokens[t] * K + k];
        } else { /* top-K of prob + bias by insertion; earlier index wins ties */
            float best[64];
            int64_t n = 0;
            for (int64_t e = 0; e < nE; e++) {
                float v = pr[e] + (bias ? bias[e] : 0.0f);
                if (n == K && !(v > best[K - 1])) continue;
                int64_t i = n < K ? n++ : K - 1;
                for (; i > 0 && v > best[i - 1]; i--) {
                    best[i] = best[i - 1];
                    sel[i] = sel[i - 1];
                }
                best[i] = v;
                sel[i] = (int32_t)e;
            }
        }
        float sum = 0;
        for (int64_t k = 0; k < K; k++) sum += (wt[k] = pr[sel[k]]);
        float scale = p->expert_weight_scale;
        for (int64_t k = 0; k < K; k++) wt[k] = wt[k] / fmaxf(sum, 6.103515625e-5f) * scale;
    }
    /* routed experts, grouped by expert so each expert's rows are read once per chunk (moe.h's
     * ds4n_moe_forward has neither this gating, sqrt(softplus) with hash layers, nor this
     * clamped, pre-weighted activation) */
    struct tensor tg = w[DSV4_GATE_EXPS], tu = w[DSV4_UP_EXPS], td = w[DSV4_DOWN_EXPS];
    int64_t gu_bytes = ff * row_bytes(tg.type, E), dn_bytes = E * row_bytes(td.type, ff);
    for (int64_t e = 0; e < nE; e++) {
        int64_t n = 0;
        for (int64_t t = 0; t < T; t++)
            for (int64_t k = 0; k < K; k++)
                if (s->sel[t * K + k] == e) {
                    s->etok[n] = (int32_t)(t * K + k);
                    memcpy(s->ebuf + n * E, s->xn + t * E, sizeof(float) * E);
                    n++;
                }
        if (!n) continue;
        struct tensor ge = {(const char *)tg.data + e * gu_bytes, tg.type};
        struct tensor ue = {(const char *)tu.data + e * gu_bytes, tu.type};
        struct tensor de = {(const char *)td.data + e * dn_bytes, td.type};
        matmul(pool, ge, ff, E, s->ebuf, n, s->eg);
        matmul(pool, ue, ff, E, s->ebuf, n, s->eu);
        for (int64_t i = 0; i < n; i++)
            swiglu(s->eg + i * ff, s->eu + i * ff, s->selw[s->etok[i]], p->swiglu_clamp, ff, s->eg + i * ff);
        matmul(pool, de, E, ff, s->eg, n, s->ebuf);
        for (int64_t i = 0; i < n; i++)
            memcpy(s->ye + (int64_t)s->etok[i] * E, s->ebuf + i * E, sizeof(float) * E);
    }
    matmul(pool, w[DSV4_GATE_SH], ff, E, s->xn, T, s->eg);
    matmul(pool, w[DSV4_UP_SH], ff, E, s->xn, T, s->eu);
    for (int64_t t = 0; t < T; t++)
        swiglu(s->eg + t * ff, s->eu + t * ff, 1.0f, p->swiglu_clamp, ff, s->eg + t * ff);
    matmul(pool, w[DSV4_DOWN_SH], E, ff, s->eg, T, s->o);
    for (int64_t t = 0; t < T; t++) { /* moe (in selection order) + shared */
        float *o = s->o + t * E;
        for (int64_t i = 0; i < E; i++) {
            float acc = 0;
            for (int64_t k = 0; k < K; k++) acc += s->ye[(t * K + k) * E + i];
            o[i] = acc + o[i];
        }
    }
    ds4n_steer_rows(s->steer, il, DS4N_STEER_FFN, s->o, T);
    hc_post(m, s, T);
}

static void head(const ds4n_dsv4_model *m, ds4n_pool *pool, struct scratch *s, int64_t t, float *logits) {
    const ds4n_dsv4_params *p = &m->p;
    int nh = p->n_hc;
    int64_t E = p->n_embd, hc = nh * E;
    const float *X = s->X + t * hc;
    float mix[16], *h = s->cur, *hn = s->xn;
    rmsnorm(X, NULL, hc, p->rms_eps, s->flat);
    matmul(pool, m->g[DSV4_OUT_HC_FN], nh, hc, s->flat, 1, mix);
    const float *scale = m->g[DSV4_OUT_HC_SCALE].data, *base = m->g[DSV4_OUT_HC_BASE].data;
    for (int64_t k = 0; k < E; k++) h[k] = 0;
    for (int i = 0; i < nh; i++) {
        float wi = sigmoidf(mix[i] * scale[0] + base[i]) + p->hc_eps;
        for (int64_t k = 0; k < E; k++) h[k] += wi * X[i * E + k];
    }
    rmsnorm(h, m->g[DSV4_OUT_NORM].data, E, p->rms_eps, hn);
    matmul(pool, m->g[DSV4_OUTPUT], p->n_vocab, E, hn, 1, logits);
}

static int bound(const ds4n_dsv4_model *m) {
    for (int i = 0; i < DSV4_N_GLOBAL; i++)
        if (!m->g[i].data) return 0;
    for (int il = 0; il < m->p.n_layer; il++) {
        int r = m->ratio[il];
        for (int sl = 0; sl < DSV4_N_LAYER_SLOT; sl++) {
            int need = sl < DSV4_CMP_APE || sl >= DSV4_HC_FFN_FN;
            if (sl >= DSV4_CMP_APE && sl <= DSV4_CMP_NORM) need = r != 0;
            if (sl >= DSV4_IDX_Q_B && sl <= DSV4_IDX_CMP_NORM) need = r == 4;
            if (sl == DSV4_EXP_BIAS) need = 0;
            if (sl == DSV4_TID2EID) need = il < m->p.n_hash_layer;
            if (need && !m->l[il][sl].data) return 0;
        }
    }
    return 1;
}

/* Every routing-table entry the tokens select names an existing expert. */
static int routes_valid(const ds4n_dsv4_model *m, const int32_t *tokens, int64_t n) {
    const ds4n_dsv4_params *p = &m->p;
    int64_t K = p->n_expert_used;
    for (int il = 0; il < p->n_hash_layer; il++) {
        const int32_t *tid = m->l[il][DSV4_TID2EID].data;
        for (int64_t t = 0; t < n; t++)
            for (int64_t k = 0; k < K; k++) {
                int32_t e = tid[(int64_t)tokens[t] * K + k];
                if (e < 0 || e >= p->n_expert) return 0;
            }
    }
    return 1;
}

int ds4n_dsv4_eval(const ds4n_dsv4_model *m, ds4n_dsv4_state *st, ds4n_pool *pool,
                   const int32_t *tokens, int64_t n, float *logits, int64_t n_logits,
                   int all_logits) {
    if (!m || !st || st->m != m || n < 0 || n > DSV4_MAX_CHUNK || (n > 0 && !tokens))
        return DSV4_ERR_ARG;
    const ds4n_dsv4_params *p = &m->p;
    if (n == 0) return DSV4_OK;
    if (n > st->n_ctx - st->pos) return DSV4_ERR_CONTEXT;
    if (logits && n_logits < (all_logits ? n : 1) * (int64_t)p->n_vocab) return DSV4_ERR_ARG;
    if (!bound(m)) return DSV4_ERR_UNBOUND;
    for (int64_t t = 0; t < n; t++)
        if (tokens[t] < 0 || tokens[t] >= p->n_vocab) return DSV4_ERR_TOKEN;
    if (!routes_valid(m, tokens, n)) return DSV4_ERR_EXPERT;
    struct scratch s;
    if (scratch_alloc(&s, m, st, n)) return DSV4_ERR_NOMEM;
    s.steer = st->steer;
    int64_t E = p->n_embd, nh = p->n_hc;
    for (int64_t t = 0; t < n; t++) {
        float *X = s.X + t * nh * E;
        tensor_row(m->g[DSV4_TOKEN_EMBD], tokens[t], E, X);
        for (int64_t i = 1; i < nh; i++) memcpy(X + i * E, X, sizeof(float) * E);
    }
    for (int il = 0; il < p->n_layer; il++) {
        attention(m, st, pool, &s, il, n, st->pos);
        ffn(m, pool, &s, il, tokens, n);
    }
    for (int64_t t = all_logits ? 0 : n - 1; logits && t < n; t++)
        head(m, pool, &s, t, logits + (all_logits ? t * p->n_vocab : 0));
    st->pos += n;
    free(s.block);
    return DSV4_OK;
}

int ds4n_dsv4_state_set_steer(ds4n_dsv4_state *st, ds4n_steer *s) {
    if (s && (ds4n_steer_n_layer(s) != st->n_layer || ds4n_steer_n_embd(s) != st->m->p.n_embd))
        return -1;
    st->steer = s;
    return 0;
}
