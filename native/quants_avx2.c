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
        __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + i));
        __m256i w = _mm256_cvtepu16_epi32(h);
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
    for (; i + 8 <= n; i += 8)
        acc0 = _mm256_fmadd_ps(load_float8(type, w, i), _mm256_loadu_ps(x + i), acc0);
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

/* ---- K-quants and IQ2_XXS ------------------------------------------------------------
 * Each type has one "codes" helper that widens 8 codes to floats; its dequantizer scales
 * them and its fused dot multiplies them into x, applying the scales once per sub-block. */

/* 32 signed bytes as 4 x 8 floats. */
DS4N_INLINE void widen32(__m256i bytes, __m256 q[4]) {
    __m128i lo = _mm256_castsi256_si128(bytes), hi = _mm256_extracti128_si256(bytes, 1);
    q[0] = i8x8(lo);
    q[1] = i8x8(_mm_srli_si128(lo, 8));
    q[2] = i8x8(hi);
    q[3] = i8x8(_mm_srli_si128(hi, 8));
}

DS4N_INLINE __m256i load32(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* Q4_K / Q5_K codes of sub-block s: nibble s%2 of qs[s/2*32 ..], bit s of qh (Q5_K). */
DS4N_INLINE void k_codes32(const uint8_t *qs, const uint8_t *qh, int s, __m256 q[4]) {
    __m256i v = _mm256_srl_epi16(load32(qs + s / 2 * 32), _mm_cvtsi32_si128(4 * (s % 2)));
    v = _mm256_and_si256(v, _mm256_set1_epi8(0x0f));
    if (qh) {
        __m256i h = _mm256_srl_epi16(load32(qh), _mm_cvtsi32_si128(s));
        v = _mm256_or_si256(v, _mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi8(1)), 4));
    }
    widen32(v, q);
}

DS4N_INLINE void dequant_k_sub32(uint16_t d16, uint16_t dmin16, const uint8_t *scales,
                                 const uint8_t *qs, const uint8_t *qh, float *y) {
    float d = f16(d16), dmin = f16(dmin16);
    __m256 q[4];
    for (int s = 0; s < 8; s++) {
        uint8_t sc, m;
        ds4n_k_scale_min(scales, s, &sc, &m);
        __m256 ds = _mm256_set1_ps(d * (float)sc), dm = _mm256_set1_ps(dmin * (float)m);
        k_codes32(qs, qh, s, q);
        for (int k = 0; k < 4; k++)
            _mm256_storeu_ps(y + 32 * s + 8 * k, _mm256_sub_ps(_mm256_mul_ps(ds, q[k]), dm));
    }
}

DS4N_DEFINE_Q45_K_DEQUANT(dequant_k_sub32)

/* Σ (d·sc·q - dmin·m)·x over Q4_K (five == 0) or Q5_K super-blocks. */
DS4N_INLINE float dot_q45_K(const void *w, const float *x, int64_t n, int five) {
    const uint8_t *p = w;
    __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps(), q[4];
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        const block_q4_K *b4 = (const block_q4_K *)p;
        const block_q5_K *b5 = (const block_q5_K *)p;
        const uint8_t *qs = five ? b5->qs : b4->qs, *qh = five ? b5->qh : NULL;
        float d = f16(b4->d), dmin = f16(b4->dmin);
        p += five ? sizeof(block_q5_K) : sizeof(block_q4_K);
        for (int s = 0; s < 8; s++) {
            uint8_t sc, m;
            ds4n_k_scale_min(b4->scales, s, &sc, &m);
            k_codes32(qs, qh, s, q);
            const float *xs = x + 32 * s;
            __m256 x0 = _mm256_loadu_ps(xs), x1 = _mm256_loadu_ps(xs + 8);
            __m256 x2 = _mm256_loadu_ps(xs + 16), x3 = _mm256_loadu_ps(xs + 24);
            __m256 qx = _mm256_mul_ps(q[0], x0);
            qx = _mm256_fmadd_ps(q[1], x1, qx);
            qx = _mm256_fmadd_ps(q[2], x2, qx);
            qx = _mm256_fmadd_ps(q[3], x3, qx);
            __m256 sum = _mm256_add_ps(_mm256_add_ps(x0, x1), _mm256_add_ps(x2, x3));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d * (float)sc), qx, acc);
            accm = _mm256_fmadd_ps(_mm256_set1_ps(dmin * (float)m), sum, accm);
        }
    }
    return ds4n_hsum_avx2(_mm256_sub_ps(acc, accm));
}

static float dot_q4_K(const void *w, const float *x, int64_t n) { return dot_q45_K(w, x, n, 0); }
static float dot_q5_K(const void *w, const float *x, int64_t n) { return dot_q45_K(w, x, n, 1); }

/* Q6_K codes of 32-group r (0..3) of half h, offset removed: 4 low bits from ql, 2 from qh. */
DS4N_INLINE void q6_codes32(const block_q6_K *b, int h, int r, __m256 q[4]) {
    __m256i lo = load32(b->ql + h * 64 + (r % 2) * 32);
    lo = _mm256_srl_epi16(lo, _mm_cvtsi32_si128(4 * (r / 2)));
    __m256i hi = _mm256_srl_epi16(load32(b->qh + h * 32), _mm_cvtsi32_si128(2 * r));
    lo = _mm256_and_si256(lo, _mm256_set1_epi8(0x0f));
    hi = _mm256_and_si256(hi, _mm256_set1_epi8(3));
    __m256i v = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
    widen32(_mm256_sub_epi8(v, _mm256_set1_epi8(32)), q);
}

static void dequant_q6_K(const void *src, float *y, int64_t n) {
    const block_q6_K *b = src;
    __m256 q[4];
    for (int64_t i = 0; i < n / QK_K; i++) {
        float d = f16(b[i].d);
        for (int g = 0; g < 8; g++, y += 32) { /* g = 32-group of the super-block */
            q6_codes32(&b[i], g / 4, g % 4, q);
            for (int k = 0; k < 4; k++) {
                __m256 ds = _mm256_set1_ps(d * (float)b[i].scales[2 * g + k / 2]);
                _mm256_storeu_ps(y + 8 * k, _mm256_mul_ps(ds, q[k]));
            }
        }
    }
}

static float dot_q6_K(const void *w, const float *x, int64_t n) {
    const block_q6_K *b = w;
    __m256 acc = _mm256_setzero_ps(), q[4];
    for (int64_t i = 0; i < n / QK_K; i++) {
        float d = f16(b[i].d);
        for (int g = 0; g < 8; g++, x += 32) {
            q6_codes32(&b[i], g / 4, g % 4, q);
            __m256 qx0 = _mm256_mul_ps(q[0], _mm256_loadu_ps(x));
            __m256 qx1 = _mm256_mul_ps(q[2], _mm256_loadu_ps(x + 16));
            qx0 = _mm256_fmadd_ps(q[1], _mm256_loadu_ps(x + 8), qx0);
            qx1 = _mm256_fmadd_ps(q[3], _mm256_loadu_ps(x + 24), qx1);
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d * (float)b[i].scales[2 * g]), qx0, acc);
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d * (float)b[i].scales[2 * g + 1]), qx1, acc);
        }
    }
    return ds4n_hsum_avx2(acc);
}

/* Q2_K / Q3_K codes of 2-bit plane j of half h: groups g = 8h + 2j (q[0], q[1]) and g + 1
 * (q[2], q[3]). Q3_K (hmask given) subtracts 4 where its high bit h*4 + j is clear. */
DS4N_INLINE void k23_codes32(const uint8_t *qs, const uint8_t *hmask, int h, int j, __m256 q[4]) {
    __m256i v = _mm256_srl_epi16(load32(qs + 32 * h), _mm_cvtsi32_si128(2 * j));
    v = _mm256_and_si256(v, _mm256_set1_epi8(3));
    if (hmask) {
        __m256i hb = _mm256_srl_epi16(load32(hmask), _mm_cvtsi32_si128(4 * h + j));
        hb = _mm256_slli_epi16(_mm256_and_si256(hb, _mm256_set1_epi8(1)), 2);
        v = _mm256_sub_epi8(_mm256_or_si256(v, hb), _mm256_set1_epi8(4));
    }
    widen32(v, q);
}

/* Scale and min of 16-group g, as the scalar dequantizers compute them. */
DS4N_INLINE void k23_scales(int type, const void *blk, int g, float *dl, float *ml) {
    if (type == DS4N_Q2_K) {
        const block_q2_K *b = blk;
        *dl = f16(b->d) * (float)(b->scales[g] & 0x0f);
        *ml = f16(b->dmin) * (float)(b->scales[g] >> 4);
    } else {
        const block_q3_K *b = blk;
        *dl = f16(b->d) * (float)ds4n_q3_K_scale(b->scales, g);
        *ml = 0.0f;
    }
}

DS4N_INLINE const uint8_t *k23_qs(int type, const void *blk) {
    return type == DS4N_Q2_K ? ((const block_q2_K *)blk)->qs : ((const block_q3_K *)blk)->qs;
}

DS4N_INLINE const uint8_t *k23_hmask(int type, const void *blk) {
    return type == DS4N_Q2_K ? NULL : ((const block_q3_K *)blk)->hmask;
}

DS4N_INLINE void dequant_k23(int type, size_t block_bytes, const void *src, float *y, int64_t n) {
    const uint8_t *p = src;
    __m256 q[4];
    for (int64_t i = 0; i < n / QK_K; i++, p += block_bytes)
        for (int g = 0; g < 16; g += 2, y += 32) {
            k23_codes32(k23_qs(type, p), k23_hmask(type, p), g / 8, (g % 8) / 2, q);
            for (int k = 0; k < 4; k++) {
                float dl, ml;
                k23_scales(type, p, g + k / 2, &dl, &ml);
                __m256 v = _mm256_mul_ps(_mm256_set1_ps(dl), q[k]);
                if (type == DS4N_Q2_K) v = _mm256_sub_ps(v, _mm256_set1_ps(ml));
                _mm256_storeu_ps(y + 8 * k, v);
            }
        }
}

DS4N_INLINE float dot_k23(int type, size_t block_bytes, const void *w, const float *x, int64_t n) {
    const uint8_t *p = w;
    __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps(), q[4];
    for (int64_t i = 0; i < n / QK_K; i++, p += block_bytes)
        for (int g = 0; g < 16; g += 2, x += 32) {
            k23_codes32(k23_qs(type, p), k23_hmask(type, p), g / 8, (g % 8) / 2, q);
            for (int half = 0; half < 2; half++) {
                float dl, ml;
                k23_scales(type, p, g + half, &dl, &ml);
                const float *xh = x + 16 * half;
                __m256 x0 = _mm256_loadu_ps(xh), x1 = _mm256_loadu_ps(xh + 8);
                __m256 qx = _mm256_fmadd_ps(q[2 * half + 1], x1, _mm256_mul_ps(q[2 * half], x0));
                acc = _mm256_fmadd_ps(_mm256_set1_ps(dl), qx, acc);
                if (type == DS4N_Q2_K)
                    accm = _mm256_fmadd_ps(_mm256_set1_ps(ml), _mm256_add_ps(x0, x1), accm);
            }
        }
    return ds4n_hsum_avx2(_mm256_sub_ps(acc, accm));
}

#define K23_KERNELS(name, T, block)                                             \
    static void dequant_##name(const void *s, float *y, int64_t n) {           \
        dequant_k23(T, sizeof(block), s, y, n);                                 \
    }                                                                           \
    static float dot_##name(const void *w, const float *x, int64_t n) {        \
        return dot_k23(T, sizeof(block), w, x, n);                              \
    }
K23_KERNELS(q2_K, DS4N_Q2_K, block_q2_K)
K23_KERNELS(q3_K, DS4N_Q3_K, block_q3_K)

/* IQ2_XXS: lattice point (idx byte l) with its signs (7-bit index l of meta), as floats. */
DS4N_INLINE __m256 iq2_codes8(uint32_t idx, uint32_t meta, int l) {
    const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    __m256 grid = u8x8(load8(ds4n_iq2xxs_grid[(idx >> (8 * l)) & 0xff]));
    __m256i s = _mm256_set1_epi32(ds4n_iq2xxs_ksigns[(meta >> (7 * l)) & 127]);
    __m256i neg = _mm256_cmpeq_epi32(_mm256_and_si256(s, bit), bit);
    neg = _mm256_and_si256(neg, _mm256_set1_epi32((int)0x80000000u));
    return _mm256_xor_ps(grid, _mm256_castsi256_ps(neg));
}

/* Group g of 32: the 4 lattice indices, and the signs plus 4-bit scale; returns the scale. */
DS4N_INLINE float iq2_group(const block_iq2_xxs *b, int g, uint32_t *idx, uint32_t *meta) {
    memcpy(idx, &b->qs[4 * g], 4);
    memcpy(meta, &b->qs[4 * g + 2], 4);
    return f16(b->d) * (0.5f + (float)(*meta >> 28)) * 0.25f;
}

static void dequant_iq2_xxs(const void *src, float *y, int64_t n) {
    const block_iq2_xxs *b = src;
    for (int64_t i = 0; i < n / QK_K; i++)
        for (int g = 0; g < 8; g++) {
            uint32_t idx, meta;
            __m256 db = _mm256_set1_ps(iq2_group(&b[i], g, &idx, &meta));
            for (int l = 0; l < 4; l++, y += 8)
                _mm256_storeu_ps(y, _mm256_mul_ps(db, iq2_codes8(idx, meta, l)));
        }
}

static float dot_iq2_xxs(const void *w, const float *x, int64_t n) {
    const block_iq2_xxs *b = w;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++)
        for (int g = 0; g < 8; g++, x += 32) {
            uint32_t idx, meta;
            float db = iq2_group(&b[i], g, &idx, &meta);
            __m256 qx = _mm256_mul_ps(iq2_codes8(idx, meta, 0), _mm256_loadu_ps(x));
            for (int l = 1; l < 4; l++)
                qx = _mm256_fmadd_ps(iq2_codes8(idx, meta, l), _mm256_loadu_ps(x + 8 * l), qx);
            acc = _mm256_fmadd_ps(_mm256_set1_ps(db), qx, acc);
        }
    return ds4n_hsum_avx2(acc);
}

/* ---- the AVX2 kernel set --------------------------------------------------------------- */

DS4N_DEFINE_FLOAT_AND_LEGACY_KERNELS

const struct ds4n_kernel_set ds4n_avx2_set = {
    .row = {
        DS4N_DOT(F32, f32), DS4N_ROW(F16, f16), DS4N_ROW(BF16, bf16),
        DS4N_ROW(Q4_0, q4_0), DS4N_ROW(Q4_1, q4_1), DS4N_ROW(Q5_0, q5_0),
        DS4N_ROW(Q5_1, q5_1), DS4N_ROW(Q8_0, q8_0),
        DS4N_ROW(Q2_K, q2_K), DS4N_ROW(Q3_K, q3_K),
        DS4N_ROW(Q4_K, q4_K), DS4N_ROW(Q5_K, q5_K), DS4N_ROW(Q6_K, q6_K),
        DS4N_ROW(IQ2_XXS, iq2_xxs),
    },
    .dot_f32 = dot_f32,
    .tile = ds4n_tile_avx2,
};
