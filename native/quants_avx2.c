/* AVX2+FMA+F16C row kernels (compiled with those flags, chosen at run time).
 *
 * Dequantizers produce bit-identical floats to the scalar ones (same products in the same
 * order, no fused multiply-add), so GEMM results do not depend on the kernel set beyond
 * summation order. Dots are fused: codes are widened to floats in registers and multiplied
 * into float32 activations; affine blocks use d·Σq·x + m·Σx. */
#include "quants_avx2.h"
#include "iq2xxs_tables.h"

static inline float f16(uint16_t h) { return _cvtsh_ss(h); }

/* 8 bytes at p as 8 floats, zero- or sign-extended. */
static inline __m256 u8x8(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)); }
static inline __m256 i8x8(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)); }
static inline __m128i load8(const uint8_t *p) { return _mm_loadl_epi64((const __m128i *)p); }

/* ---- float types ---------------------------------------------------------------------- */

DS4N_INLINE __m256 load_float8(int type, const void *p, int64_t i) {
    switch (type) {
    case DS4N_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
    case DS4N_BF16: {
        __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
        return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
    }
    default:
        return _mm256_loadu_ps((const float *)p + i);
    }
}

DS4N_INLINE void dequant_float(int type, const void *src, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, load_float8(type, src, i));
    for (; i < n; i++) y[i] = load_float1(type, src, i);
}

DS4N_INLINE float dot_float(int type, const void *w, const float *x, int64_t n) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(load_float8(type, w, i), _mm256_loadu_ps(x + i), acc0);
        acc1 = _mm256_fmadd_ps(load_float8(type, w, i + 8), _mm256_loadu_ps(x + i + 8), acc1);
    }
    for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(load_float8(type, w, i), _mm256_loadu_ps(x + i), acc0);
    float s = ds4n_hsum_avx2(_mm256_add_ps(acc0, acc1));
    for (; i < n; i++) s += load_float1(type, w, i) * x[i];
    return s;
}

/* ---- legacy 32-value blocks ------------------------------------------------------------ */

struct legacy_block {
    float d, m;
    __m256 q[4]; /* the 32 codes, offset removed */
};

/* 16 bits -> 16 bytes, 0x10 where the bit is set (the 5th bit of Q5 codes). */
static inline __m128i fifth_bits(uint32_t bits) {
    __m128i v = _mm_shuffle_epi8(_mm_cvtsi32_si128((int)bits),
                                 _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1));
    __m128i mask = _mm_set1_epi64x((int64_t)0x8040201008040201ull);
    return _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(v, mask), mask), _mm_set1_epi8(0x10));
}

/* Codes j (low nibbles) and j+16 (high nibbles) of qs, with bit 4 from qh if given. */
DS4N_INLINE void unpack_nibbles(const uint8_t *qs, const uint8_t *qh, int offset, __m256 q[4]) {
    __m128i bytes = _mm_loadu_si128((const __m128i *)qs), m4 = _mm_set1_epi8(0x0f);
    __m128i lo = _mm_and_si128(bytes, m4), hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), m4);
    if (qh) {
        uint32_t h;
        memcpy(&h, qh, 4);
        lo = _mm_or_si128(lo, fifth_bits(h & 0xffff));
        hi = _mm_or_si128(hi, fifth_bits(h >> 16));
    }
    lo = _mm_sub_epi8(lo, _mm_set1_epi8((char)offset));
    hi = _mm_sub_epi8(hi, _mm_set1_epi8((char)offset));
    q[0] = i8x8(lo);
    q[1] = i8x8(_mm_srli_si128(lo, 8));
    q[2] = i8x8(hi);
    q[3] = i8x8(_mm_srli_si128(hi, 8));
}

static inline void unpack_q8(const int8_t *qs, __m256 q[4]) {
    for (int k = 0; k < 4; k++) q[k] = i8x8(load8((const uint8_t *)qs + 8 * k));
}

DS4N_DEFINE_LOAD_LEGACY


DS4N_INLINE void dequant_legacy(int type, int64_t block_bytes, const void *src, float *y,
                                int64_t n) {
    const uint8_t *p = src;
    struct legacy_block b;
    for (int64_t i = 0; i < n / QK; i++, p += block_bytes, y += QK) {
        load_legacy(type, p, &b);
        __m256 d = _mm256_set1_ps(b.d), m = _mm256_set1_ps(b.m);
        for (int k = 0; k < 4; k++) {
            __m256 v = _mm256_mul_ps(d, b.q[k]);
            _mm256_storeu_ps(y + 8 * k, is_affine(type) ? _mm256_add_ps(v, m) : v);
        }
    }
}

DS4N_INLINE float dot_legacy(int type, int64_t block_bytes, const void *w, const float *x,
                             int64_t n) {
    const uint8_t *p = w;
    __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    struct legacy_block b;
    for (int64_t i = 0; i < n / QK; i++, p += block_bytes, x += QK) {
        load_legacy(type, p, &b);
        __m256 x0 = _mm256_loadu_ps(x), x1 = _mm256_loadu_ps(x + 8);
        __m256 x2 = _mm256_loadu_ps(x + 16), x3 = _mm256_loadu_ps(x + 24);
        __m256 qx = _mm256_mul_ps(b.q[0], x0);
        qx = _mm256_fmadd_ps(b.q[1], x1, qx);
        qx = _mm256_fmadd_ps(b.q[2], x2, qx);
        qx = _mm256_fmadd_ps(b.q[3], x3, qx);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(b.d), qx, acc);
        if (is_affine(type)) {
            __m256 xs = _mm256_add_ps(_mm256_add_ps(x0, x1), _mm256_add_ps(x2, x3));
            accm = _mm256_fmadd_ps(_mm256_set1_ps(b.m), xs, accm);
        }
    }
    return ds4n_hsum_avx2(_mm256_add_ps(acc, accm));
}

/* ---- K-quants and IQ2_XXS: dequantizers (their dots go through them) --------------------- */

/* Q4_K / Q5_K: sub-block s of 32 is nibble s%2 of qs[s/2*32 ..], bit s of qh[..] (Q5_K). */
DS4N_INLINE void dequant_k_sub32(uint16_t d16, uint16_t dmin16, const uint8_t *scales,
                                 const uint8_t *qs, const uint8_t *qh, float *y) {
    float d = f16(d16), dmin = f16(dmin16);
    const __m128i m4 = _mm_set1_epi8(0x0f), one = _mm_set1_epi8(1);
    for (int s = 0; s < 8; s++) {
        uint8_t sc, m;
        ds4n_k_scale_min(scales, s, &sc, &m);
        __m256 ds = _mm256_set1_ps(d * (float)sc), dm = _mm256_set1_ps(dmin * (float)m);
        for (int k = 0; k < 4; k++) {
            __m128i q = _mm_and_si128(_mm_srli_epi16(load8(qs + s / 2 * 32 + 8 * k), 4 * (s % 2)), m4);
            if (qh) {
                __m128i h = _mm_and_si128(_mm_srl_epi16(load8(qh + 8 * k), _mm_cvtsi32_si128(s)), one);
                q = _mm_or_si128(q, _mm_slli_epi16(h, 4));
            }
            _mm256_storeu_ps(y + 32 * s + 8 * k, _mm256_sub_ps(_mm256_mul_ps(ds, u8x8(q)), dm));
        }
    }
}

DS4N_DEFINE_Q45_K_DEQUANT(dequant_k_sub32)

static void dequant_q6_K(const void *src, float *y, int64_t n) {
    const block_q6_K *b = src;
    const __m128i m4 = _mm_set1_epi8(0x0f), m2 = _mm_set1_epi8(3);
    const __m256i off = _mm256_set1_epi32(32);
    for (int64_t i = 0; i < n / QK_K; i++) {
        float d = f16(b[i].d);
        for (int e = 0; e < QK_K; e += 8, y += 8) {
            int h = e / 128, r = (e % 128) / 32, l = e % 32; /* half, 32-group, offset */
            __m128i lo = _mm_and_si128(_mm_srli_epi16(load8(b[i].ql + h * 64 + (r % 2) * 32 + l), 4 * (r / 2)), m4);
            __m128i hi = _mm_and_si128(_mm_srli_epi16(load8(b[i].qh + h * 32 + l), 2 * r), m2);
            __m256i q = _mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_or_si128(lo, _mm_slli_epi16(hi, 4))), off);
            __m256 ds = _mm256_set1_ps(d * (float)b[i].scales[e / 16]);
            _mm256_storeu_ps(y, _mm256_mul_ps(ds, _mm256_cvtepi32_ps(q)));
        }
    }
}

static void dequant_iq2_xxs(const void *src, float *y, int64_t n) {
    const block_iq2_xxs *b = src;
    const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    const __m256i sign = _mm256_set1_epi32((int)0x80000000u);
    for (int64_t i = 0; i < n / QK_K; i++) {
        float d = f16(b[i].d);
        for (int g = 0; g < 8; g++) {
            uint32_t idx, meta;
            memcpy(&idx, &b[i].qs[4 * g], 4);
            memcpy(&meta, &b[i].qs[4 * g + 2], 4);
            __m256 db = _mm256_set1_ps(d * (0.5f + (float)(meta >> 28)) * 0.25f);
            for (int l = 0; l < 4; l++, y += 8) {
                __m256 grid = u8x8(load8(ds4n_iq2xxs_grid[(idx >> (8 * l)) & 0xff]));
                __m256i s = _mm256_set1_epi32(ds4n_iq2xxs_ksigns[(meta >> (7 * l)) & 127]);
                __m256i neg = _mm256_and_si256(_mm256_cmpeq_epi32(_mm256_and_si256(s, bit), bit), sign);
                _mm256_storeu_ps(y, _mm256_xor_ps(_mm256_mul_ps(db, grid), _mm256_castsi256_ps(neg)));
            }
        }
    }
}

/* ---- the AVX2 kernel set --------------------------------------------------------------- */

DS4N_DEFINE_FLOAT_AND_LEGACY_KERNELS

#define DOT_VIA(name, block) DS4N_DOT_VIA_DEQUANT(dot_##name, dequant_##name, dot_f32, QK_K, sizeof(block))
DOT_VIA(q4_K, block_q4_K)
DOT_VIA(q5_K, block_q5_K)
DOT_VIA(q6_K, block_q6_K)
DOT_VIA(iq2_xxs, block_iq2_xxs)

/* Q2_K and Q3_K keep the scalar dequantizer but get the vector dot. */
DS4N_DOT_VIA_SCALAR_DEQUANT(dot_q2_K, DS4N_Q2_K, dot_f32)
DS4N_DOT_VIA_SCALAR_DEQUANT(dot_q3_K, DS4N_Q3_K, dot_f32)

const struct ds4n_kernel_set ds4n_avx2_set = {
    .row = {
        DS4N_DOT(F32, f32), DS4N_ROW(F16, f16), DS4N_ROW(BF16, bf16),
        DS4N_ROW(Q4_0, q4_0), DS4N_ROW(Q4_1, q4_1), DS4N_ROW(Q5_0, q5_0), DS4N_ROW(Q5_1, q5_1), DS4N_ROW(Q8_0, q8_0),
        DS4N_DOT(Q2_K, q2_K), DS4N_DOT(Q3_K, q3_K),
        DS4N_ROW(Q4_K, q4_K), DS4N_ROW(Q5_K, q5_K), DS4N_ROW(Q6_K, q6_K), DS4N_ROW(IQ2_XXS, iq2_xxs),
    },
    .dot_f32 = dot_f32,
    .tile = ds4n_tile_avx2,
};
