/* Scalar kernels of every type: the reference the SIMD kernels are tested against, and the
 * fallback wherever a SIMD level has no kernel of its own. Plain, obviously-right code. */
#include "quants.h"
#include "iq2xxs_tables.h"
#include "nibble_tables.h"

/* ---- traits ------------------------------------------------------------------------ */

static const struct ds4n_type_traits traits[DS4N_TYPE_SLOTS] = {
    [DS4N_F32] = {"F32", 1, 4},
    [DS4N_F16] = {"F16", 1, 2},
    [DS4N_BF16] = {"BF16", 1, 2},
    [DS4N_Q4_0] = {"Q4_0", QK, sizeof(block_q4_0)},
    [DS4N_Q4_1] = {"Q4_1", QK, sizeof(block_q4_1)},
    [DS4N_Q5_0] = {"Q5_0", QK, sizeof(block_q5_0)},
    [DS4N_Q5_1] = {"Q5_1", QK, sizeof(block_q5_1)},
    [DS4N_Q8_0] = {"Q8_0", QK, sizeof(block_q8_0)},
    [DS4N_Q2_K] = {"Q2_K", QK_K, sizeof(block_q2_K)},
    [DS4N_Q3_K] = {"Q3_K", QK_K, sizeof(block_q3_K)},
    [DS4N_Q4_K] = {"Q4_K", QK_K, sizeof(block_q4_K)},
    [DS4N_Q5_K] = {"Q5_K", QK_K, sizeof(block_q5_K)},
    [DS4N_Q6_K] = {"Q6_K", QK_K, sizeof(block_q6_K)},
    [DS4N_IQ2_XXS] = {"IQ2_XXS", QK_K, sizeof(block_iq2_xxs)},
    [DS4N_IQ4_NL] = {"IQ4_NL", QK, sizeof(block_iq4_nl)},
    [DS4N_IQ4_XS] = {"IQ4_XS", QK_K, sizeof(block_iq4_xs)},
    [DS4N_MXFP4] = {"MXFP4", QK, sizeof(block_mxfp4)},
};

_Static_assert(sizeof(block_q4_0) == 18 && sizeof(block_q4_1) == 20, "GGML block layout");
_Static_assert(sizeof(block_q5_0) == 22 && sizeof(block_q5_1) == 24, "GGML block layout");
_Static_assert(sizeof(block_q8_0) == 34 && sizeof(block_q2_K) == 84, "GGML block layout");
_Static_assert(sizeof(block_q3_K) == 110 && sizeof(block_q4_K) == 144, "GGML block layout");
_Static_assert(sizeof(block_q5_K) == 176 && sizeof(block_q6_K) == 210, "GGML block layout");
_Static_assert(sizeof(block_iq2_xxs) == 66 && sizeof(block_iq4_nl) == 18, "GGML block layout");
_Static_assert(sizeof(block_iq4_xs) == 136 && sizeof(block_mxfp4) == 17, "GGML block layout");

const struct ds4n_type_traits *ds4n_traits(int type) {
    if (type < 0 || type >= DS4N_TYPE_SLOTS || traits[type].name == NULL) return NULL;
    return &traits[type];
}

int ds4n_type_supported(int type) { return ds4n_traits(type) != NULL; }
int64_t ds4n_type_block_size(int type) { return ds4n_traits(type) ? traits[type].block_size : 0; }
int64_t ds4n_type_block_bytes(int type) { return ds4n_traits(type) ? traits[type].block_bytes : 0; }

void ds4n_dequantize(int type, const void *src, float *dst, int64_t n) {
    const struct ds4n_row_kernels *k = ds4n_active_kernels(type);
    if (k) k->dequantize(src, dst, n);
}

float ds4n_dot(int type, const void *w, const float *x, int64_t n) {
    const struct ds4n_row_kernels *k = ds4n_active_kernels(type);
    return k ? k->dot(w, x, n) : 0.0f;
}

/* ---- float types --------------------------------------------------------------------- */

static float dot_f32(const void *w, const float *x, int64_t n) {
    /* Eight partial sums, like the SIMD lanes: the same rounding shape, and vectorisable. */
    const float *a = w;
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) acc[l] += a[i + l] * x[i + l];
    for (; i < n; i++) acc[0] += a[i] * x[i];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

static void dequant_f32(const void *src, float *dst, int64_t n) { memcpy(dst, src, (size_t)n * 4); }

static void dequant_f16(const void *src, float *dst, int64_t n) {
    const uint16_t *h = src;
    for (int64_t i = 0; i < n; i++) dst[i] = ds4n_f16_to_f32(h[i]);
}

static void dequant_bf16(const void *src, float *dst, int64_t n) {
    const uint16_t *h = src;
    for (int64_t i = 0; i < n; i++) dst[i] = ds4n_bf16_to_f32(h[i]);
}

/* ---- legacy 32-value blocks: y = d*q + m, q from 4 low bits (+ a 5th bit) --------------- */

/* q[j] = nibble j of qs (low nibbles first, then high nibbles), plus bit j of qh as bit 4. */
static void unpack_nibbles(const uint8_t *qs, uint32_t qh, int offset, float *q) {
    for (int j = 0; j < QK / 2; j++) {
        q[j] = (float)((int)((qs[j] & 0x0f) | ((qh >> j) & 1) << 4) - offset);
        q[j + QK / 2] = (float)((int)((qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4) - offset);
    }
}

static void affine(float d, float m, const float *q, float *y, int n) {
    for (int j = 0; j < n; j++) y[j] = d * q[j] + m;
}

static uint32_t load_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static void dequant_q4_0(const void *src, float *y, int64_t n) {
    const block_q4_0 *b = src;
    float q[QK];
    for (int64_t i = 0; i < n / QK; i++, y += QK) {
        unpack_nibbles(b[i].qs, 0, 8, q);
        affine(ds4n_f16_to_f32(b[i].d), 0.0f, q, y, QK);
    }
}

static void dequant_q4_1(const void *src, float *y, int64_t n) {
    const block_q4_1 *b = src;
    float q[QK];
    for (int64_t i = 0; i < n / QK; i++, y += QK) {
        unpack_nibbles(b[i].qs, 0, 0, q);
        affine(ds4n_f16_to_f32(b[i].d), ds4n_f16_to_f32(b[i].m), q, y, QK);
    }
}

static void dequant_q5_0(const void *src, float *y, int64_t n) {
    const block_q5_0 *b = src;
    float q[QK];
    for (int64_t i = 0; i < n / QK; i++, y += QK) {
        unpack_nibbles(b[i].qs, load_u32(b[i].qh), 16, q);
        affine(ds4n_f16_to_f32(b[i].d), 0.0f, q, y, QK);
    }
}

static void dequant_q5_1(const void *src, float *y, int64_t n) {
    const block_q5_1 *b = src;
    float q[QK];
    for (int64_t i = 0; i < n / QK; i++, y += QK) {
        unpack_nibbles(b[i].qs, load_u32(b[i].qh), 0, q);
        affine(ds4n_f16_to_f32(b[i].d), ds4n_f16_to_f32(b[i].m), q, y, QK);
    }
}

static void dequant_q8_0(const void *src, float *y, int64_t n) {
    const block_q8_0 *b = src;
    for (int64_t i = 0; i < n / QK; i++, y += QK) {
        float d = ds4n_f16_to_f32(b[i].d);
        for (int j = 0; j < QK; j++) y[j] = d * (float)b[i].qs[j];
    }
}

/* ---- K-quants: 256-value super-blocks with per-16 or per-32 sub-block scales ------------ */

/* Q2_K and Q3_K: sixteen groups of 16; group g holds 2-bit plane (g%8)/2 of bytes
 * qs[g/8*32 + g%2*16 ..], i.e. value e = 16g + l comes from byte e/128*32 + e%32. */
static const uint8_t *k_plane(const uint8_t *qs, int g, int *shift) {
    *shift = 2 * ((g % 8) / 2);
    return qs + g / 8 * 32 + g % 2 * 16;
}

static void dequant_q2_K(const void *src, float *y, int64_t n) {
    const block_q2_K *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        float d = ds4n_f16_to_f32(b[i].d), dmin = ds4n_f16_to_f32(b[i].dmin);
        for (int g = 0; g < 16; g++, y += 16) {
            int shift;
            const uint8_t *q = k_plane(b[i].qs, g, &shift);
            float dl = d * (float)(b[i].scales[g] & 0x0f), ml = dmin * (float)(b[i].scales[g] >> 4);
            for (int l = 0; l < 16; l++) y[l] = dl * (float)((q[l] >> shift) & 3) - ml;
        }
    }
}

/* Q3_K adds a high bit per value: bit g/2 of hmask[e%32]; a clear bit subtracts 4. */
static void dequant_q3_K(const void *src, float *y, int64_t n) {
    const block_q3_K *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        float d = ds4n_f16_to_f32(b[i].d);
        for (int g = 0; g < 16; g++, y += 16) {
            int shift;
            const uint8_t *q = k_plane(b[i].qs, g, &shift), *hm = b[i].hmask + g % 2 * 16;
            float dl = d * (float)ds4n_q3_K_scale(b[i].scales, g);
            for (int l = 0; l < 16; l++) {
                int v = ((q[l] >> shift) & 3) - (((hm[l] >> (g / 2)) & 1) ? 0 : 4);
                y[l] = dl * (float)v;
            }
        }
    }
}

/* Q4_K and Q5_K: eight sub-blocks of 32, y = d*sc*q - dmin*m; Q5_K adds bit s of qh[l]. */
static void dequant_k_sub32(uint16_t d16, uint16_t dmin16, const uint8_t *scales,
                            const uint8_t *qs, const uint8_t *qh, float *y) {
    float d = ds4n_f16_to_f32(d16), dmin = ds4n_f16_to_f32(dmin16);
    for (int s = 0; s < 8; s++) {
        uint8_t sc, m;
        ds4n_k_scale_min(scales, s, &sc, &m);
        float ds = d * (float)sc, dm = dmin * (float)m;
        for (int l = 0; l < 32; l++) {
            int q = (qs[s / 2 * 32 + l] >> (4 * (s % 2))) & 0x0f;
            if (qh) q |= ((qh[l] >> s) & 1) << 4;
            *y++ = ds * (float)q - dm;
        }
    }
}

DS4N_DEFINE_Q45_K_DEQUANT(dequant_k_sub32)

static void dequant_q6_K(const void *src, float *y, int64_t n) {
    const block_q6_K *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        float d = ds4n_f16_to_f32(b[i].d);
        for (int e = 0; e < QK_K; e++) {
            int h = e / 128, r = e % 128;
            int lo = (b[i].ql[h * 64 + r % 64] >> (4 * (r / 64))) & 0x0f;
            int hi = (b[i].qh[h * 32 + r % 32] >> (2 * (r / 32))) & 3;
            *y++ = d * (float)b[i].scales[e / 16] * (float)((lo | hi << 4) - 32);
        }
    }
}

/* ---- IQ2_XXS: 8 groups of 32; each 8 values are a lattice point with a sign pattern ---- */

static void dequant_iq2_xxs(const void *src, float *y, int64_t n) {
    const block_iq2_xxs *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        float d = ds4n_f16_to_f32(b[i].d);
        for (int g = 0; g < 8; g++) {
            uint32_t idx, meta; /* 4 grid indices; 4 x 7-bit sign indices + 4-bit scale */
            memcpy(&idx, &b[i].qs[4 * g], 4);
            memcpy(&meta, &b[i].qs[4 * g + 2], 4);
            float db = d * (0.5f + (float)(meta >> 28)) * 0.25f;
            for (int l = 0; l < 4; l++) {
                const uint8_t *grid = ds4n_iq2xxs_grid[(idx >> (8 * l)) & 0xff];
                uint8_t signs = ds4n_iq2xxs_ksigns[(meta >> (7 * l)) & 127];
                for (int j = 0; j < 8; j++)
                    *y++ = db * (float)grid[j] * ((signs >> j) & 1 ? -1.0f : 1.0f);
            }
        }
    }
}

/* ---- 4-bit codes through a 16-value table: IQ4_NL, IQ4_XS, MXFP4 ----------------------- */

/* 32 values y = d * table[code]: codes are the low nibbles of qs[0..16), then the high ones. */
static void table_nibbles(const uint8_t *qs, const int8_t *table, float d, float *y) {
    for (int j = 0; j < QK / 2; j++) {
        y[j] = d * (float)table[qs[j] & 0x0f];
        y[j + QK / 2] = d * (float)table[qs[j] >> 4];
    }
}

static void dequant_iq4_nl(const void *src, float *y, int64_t n) {
    const block_iq4_nl *b = src;
    for (int64_t i = 0; i < n / QK; i++, y += QK)
        table_nibbles(b[i].qs, ds4n_iq4nl_values, ds4n_f16_to_f32(b[i].d), y);
}

static void dequant_mxfp4(const void *src, float *y, int64_t n) {
    const block_mxfp4 *b = src;
    for (int64_t i = 0; i < n / QK; i++, y += QK)
        table_nibbles(b[i].qs, ds4n_mxfp4_values, ds4n_e8m0_to_f32_half(b[i].e), y);
}

/* IQ4_XS: IQ4_NL's levels in eight sub-blocks of 32, each with its own 6-bit scale. */
static void dequant_iq4_xs(const void *src, float *y, int64_t n) {
    const block_iq4_xs *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        float d = ds4n_f16_to_f32(b[i].d);
        for (int ib = 0; ib < QK_K / QK; ib++, y += QK) {
            float dl = d * (float)ds4n_iq4_xs_scale(&b[i], ib);
            table_nibbles(b[i].qs + ib * QK / 2, ds4n_iq4nl_values, dl, y);
        }
    }
}

/* ---- the scalar kernel set ------------------------------------------------------------- */

/* Scalar dots all go through the dequantizer: one obviously-right definition per type. */
static float dot_via_dequant(ds4n_dequant_fn dequantize, int64_t block_size, int64_t block_bytes,
                             const void *w, const float *x, int64_t n) {
    enum { CHUNK = 512 }; /* a multiple of every block size */
    float buf[CHUNK], sum = 0.0f;
    const uint8_t *src = w;
    for (int64_t i = 0; i < n; i += CHUNK) {
        int64_t len = n - i < CHUNK ? n - i : CHUNK;
        dequantize(src + i / block_size * block_bytes, buf, len);
        sum += dot_f32(buf, x + i, len);
    }
    return sum;
}

/* dot_via_dequant for R rows and T tokens, each chunk of a row dequantized once: token t's
 * sum is bitwise its dot_via_dequant (the same chunks, dot_f32 calls and additions in the
 * same order). */
static void cols_via_dequant(ds4n_dequant_fn dequantize, int64_t block_size, int64_t block_bytes,
                             const void *w, int64_t row_stride, const float *x, int64_t ldx,
                             int64_t n, float *y, int64_t ldy, int R, int T) {
    enum { CHUNK = 512 };
    float buf[CHUNK];
    for (int r = 0; r < R; r++) {
        float sum[DS4N_SMALL_T] = {0};
        const uint8_t *src = (const uint8_t *)w + r * row_stride;
        for (int64_t i = 0; i < n; i += CHUNK) {
            int64_t len = n - i < CHUNK ? n - i : CHUNK;
            dequantize(src + i / block_size * block_bytes, buf, len);
            for (int t = 0; t < T; t++) sum[t] += dot_f32(buf, x + t * ldx + i, len);
        }
        for (int t = 0; t < T; t++) y[t * ldy + r] = sum[t];
    }
}

static void cols_f32(const void *w, int64_t row_stride, const float *x, int64_t ldx,
                     const float *xsum, int64_t n, float *y, int64_t ldy, int R, int T) {
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++)
            y[t * ldy + r] = dot_f32((const float *)((const uint8_t *)w + r * row_stride),
                                     x + t * ldx, n);
}

#define DOT_VIA(name, bs, bb)                                                          \
    static float dot_##name(const void *w, const float *x, int64_t n) {               \
        return dot_via_dequant(dequant_##name, bs, bb, w, x, n);                       \
    }                                                                                  \
    static void cols_##name(const void *w, int64_t rs, const float *x, int64_t ldx,   \
                            const float *xsum, int64_t n, float *y, int64_t ldy, int R,    \
                            int T) {                                                       \
        cols_via_dequant(dequant_##name, bs, bb, w, rs, x, ldx, n, y, ldy, R, T);      \
    }
DOT_VIA(f16, 1, 2)
DOT_VIA(bf16, 1, 2)
DOT_VIA(q4_0, QK, sizeof(block_q4_0))
DOT_VIA(q4_1, QK, sizeof(block_q4_1))
DOT_VIA(q5_0, QK, sizeof(block_q5_0))
DOT_VIA(q5_1, QK, sizeof(block_q5_1))
DOT_VIA(q8_0, QK, sizeof(block_q8_0))
DOT_VIA(q2_K, QK_K, sizeof(block_q2_K))
DOT_VIA(q3_K, QK_K, sizeof(block_q3_K))
DOT_VIA(q4_K, QK_K, sizeof(block_q4_K))
DOT_VIA(q5_K, QK_K, sizeof(block_q5_K))
DOT_VIA(q6_K, QK_K, sizeof(block_q6_K))
DOT_VIA(iq2_xxs, QK_K, sizeof(block_iq2_xxs))
DOT_VIA(iq4_nl, QK, sizeof(block_iq4_nl))
DOT_VIA(iq4_xs, QK_K, sizeof(block_iq4_xs))
DOT_VIA(mxfp4, QK, sizeof(block_mxfp4))

static void tile_scalar(const float *W, int64_t ldw, const float *X, int64_t ldx, int64_t k,
                        float *Y, int64_t ldy, int R, int C, int accumulate) {
    for (int r = 0; r < R; r++)
        for (int t = 0; t < C; t++) {
            float s = dot_f32(W + r * ldw, X + t * ldx, k);
            Y[t * ldy + r] = accumulate ? Y[t * ldy + r] + s : s;
        }
}

/* No multi-row kernels; small batches dequantize each chunk once for all tokens. */
#define ROW(T, name) [DS4N_##T] = {dequant_##name, dot_##name, NULL, cols_##name, NULL}
const struct ds4n_kernel_set ds4n_scalar_set = {
    .row = {
        ROW(F32, f32), ROW(F16, f16), ROW(BF16, bf16),
        ROW(Q4_0, q4_0), ROW(Q4_1, q4_1), ROW(Q5_0, q5_0), ROW(Q5_1, q5_1), ROW(Q8_0, q8_0),
        ROW(Q2_K, q2_K), ROW(Q3_K, q3_K), ROW(Q4_K, q4_K), ROW(Q5_K, q5_K), ROW(Q6_K, q6_K),
        ROW(IQ2_XXS, iq2_xxs), ROW(IQ4_NL, iq4_nl), ROW(IQ4_XS, iq4_xs), ROW(MXFP4, mxfp4),
    },
    .tile = tile_scalar,
};
