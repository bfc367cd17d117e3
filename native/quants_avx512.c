/* AVX-512 row kernels (F, BW, VL, DQ with FMA and F16C; compiled with those flags, chosen at
 * run time): the vector primitives and code unpackers quants_generic.h builds every type's
 * kernels from. A v16 is one 16-float register, so a 32-value block is two.
 *
 * With 512-bit operations only two vector ports execute (p0 and p5 on Intel cores), and the
 * byte-to-lane widenings and permutes all need p5; the unpackers below keep that port's share
 * low: bytes go to 32-bit lanes straight from memory (one p5 op per 16 codes), nibbles are
 * split with AND and shift (either port), the Q5 fifth bits and IQ2 signs are applied under
 * mask registers, and 4-bit lookup tables are one lane permute per 16 codes. */
#include "prefetch.h"
#include "quants_avx512.h"
#include "iq2xxs_tables.h"
#include "nibble_tables.h"

static inline float f16(uint16_t h) { return _cvtsh_ss(h); }

/* ---- primitives ------------------------------------------------------------------------ */

typedef __m512 vacc;
typedef __m512 v16;

static inline vacc vzero(void) { return _mm512_setzero_ps(); }
static inline vacc vadd(vacc a, vacc b) { return _mm512_add_ps(a, b); }
static inline vacc vsub(vacc a, vacc b) { return _mm512_sub_ps(a, b); }
static inline float vhsum(vacc a) { return ds4n_hsum_avx512(a); }
static inline vacc vfma_s(vacc acc, float s, vacc v) {
    return _mm512_fmadd_ps(_mm512_set1_ps(s), v, acc);
}
static inline vacc vfma_m(vacc acc, const float *s, vacc v) { return vfma_s(acc, *s, v); }

static inline vacc v16_dot(v16 q, const float *x) { return _mm512_mul_ps(q, _mm512_loadu_ps(x)); }

/* acc + q·x, lane-wise (no horizontal sum). */
static inline vacc v16_fma(vacc acc, v16 q, const float *x) {
    return _mm512_fmadd_ps(q, _mm512_loadu_ps(x), acc);
}

static inline vacc v16_sum(const float *x) { return _mm512_loadu_ps(x); }

static inline void v16_store(float *y, v16 q, float d) {
    _mm512_storeu_ps(y, _mm512_mul_ps(_mm512_set1_ps(d), q));
}

static inline void v16_store_affine(float *y, v16 q, float d, float m) {
    _mm512_storeu_ps(y, _mm512_add_ps(_mm512_mul_ps(_mm512_set1_ps(d), q), _mm512_set1_ps(m)));
}

/* ---- float rows ------------------------------------------------------------------------ */

DS4N_INLINE __m512 load_float16(int type, const void *p, int64_t i) {
    switch (type) {
    case DS4N_F16:
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i)));
    case DS4N_BF16: {
        __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    default:
        return _mm512_loadu_ps((const float *)p + i);
    }
}

DS4N_INLINE void dequant_float(int type, const void *src, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, load_float16(type, src, i));
    for (; i < n; i++) y[i] = load_float1(type, src, i);
}

DS4N_INLINE float dot_float(int type, const void *w, const float *x, int64_t n) {
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm512_fmadd_ps(load_float16(type, w, i), _mm512_loadu_ps(x + i), acc0);
        acc1 = _mm512_fmadd_ps(load_float16(type, w, i + 16), _mm512_loadu_ps(x + i + 16), acc1);
    }
    for (; i + 16 <= n; i += 16)
        acc0 = _mm512_fmadd_ps(load_float16(type, w, i), _mm512_loadu_ps(x + i), acc0);
    float s = ds4n_hsum_avx512(_mm512_add_ps(acc0, acc1));
    for (; i < n; i++) s += load_float1(type, w, i) * x[i];
    return s;
}

/* ---- code unpackers -------------------------------------------------------------------- */

static inline __m128i load16(const void *p) { return _mm_loadu_si128((const __m128i *)p); }
static inline __m256i load32(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }
/* 16 bytes to 16 lanes, unsigned / signed (the load is part of the widening). */
static inline __m512i u8x16(const void *p) { return _mm512_cvtepu8_epi32(load16(p)); }
static inline __m512 i8x16f(__m128i b) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)); }

/* 32 signed bytes as two v16. */
static inline void widen32(__m256i b, v16 q[2]) {
    q[0] = i8x16f(_mm256_castsi256_si128(b));
    q[1] = i8x16f(_mm256_extracti128_si256(b, 1));
}

/* Byte-wise right shift of 32 bytes by a run-time count (bits shifted in are masked off). */
static inline __m256i shr32(__m256i v, int count) {
    return _mm256_srl_epi16(v, _mm_cvtsi32_si128(count));
}

/* Codes to floats without a conversion: a nibble n placed in the low mantissa bits of 2^23
 * (low nibbles) or, kept in bits 4..7, of 2^19 (whose mantissa step is 1/16: high nibbles)
 * is the float 2^23 + n or 2^19 + n, and one subtraction takes the base and the type's offset
 * off, exactly (both operands in [2^k, 2^(k+1)): Sterbenz). The fifth bit is 16 at either
 * place, set under a mask read straight from qh. */
#define LO_BASE 0x4B000000 /* 2^23 */
#define HI_BASE 0x49000000 /* 2^19 */
#define AND_OR 0xEA        /* vpternlog: (a & b) | c */

DS4N_INLINE void legacy_codes(const uint8_t *qs, const uint8_t *qh, int offset, v16 q[2]) {
    const __m512i b = u8x16(qs);
    __m512i lo = _mm512_ternarylogic_epi32(b, _mm512_set1_epi32(0x0f), _mm512_set1_epi32(LO_BASE),
                                           AND_OR);
    __m512i hi = _mm512_ternarylogic_epi32(b, _mm512_set1_epi32(0xf0), _mm512_set1_epi32(HI_BASE),
                                           AND_OR);
    if (qh) { /* bit j of qh is the fifth bit of code j */
        /* kmovw from memory is a load alone; through a general register it is another
         * shuffle-port operation per 16 codes. */
        __mmask16 k0, k1;
        __asm__("kmovw %1, %0" : "=k"(k0) : "m"(*(const uint8_t(*)[2])qh));
        __asm__("kmovw %1, %0" : "=k"(k1) : "m"(*(const uint8_t(*)[2])(qh + 2)));
        lo = _mm512_mask_or_epi32(lo, k0, lo, _mm512_set1_epi32(0x10));
        hi = _mm512_mask_or_epi32(hi, k1, hi, _mm512_set1_epi32(0x100));
    }
    q[0] = _mm512_sub_ps(_mm512_castsi512_ps(lo), _mm512_set1_ps(8388608.0f + (float)offset));
    q[1] = _mm512_sub_ps(_mm512_castsi512_ps(hi), _mm512_set1_ps(524288.0f + (float)offset));
}

/* out[2r], out[2r+1] = the two halves at p + r*stride as floats, r < R (the d and m of R
 * blocks, or d and two code bytes): one conversion for all R rows. */
DS4N_INLINE void f16_pairs(const uint8_t *p, int64_t stride, const int R, float *out) {
    uint32_t u;
    memcpy(&u, p, 4);
    __m128i v = _mm_cvtsi32_si128((int)u);
    if (R > 1) memcpy(&u, p + stride, 4), v = _mm_insert_epi32(v, (int)u, 1);
    if (R > 2) memcpy(&u, p + 2 * stride, 4), v = _mm_insert_epi32(v, (int)u, 2);
    if (R > 3) memcpy(&u, p + 3 * stride, 4), v = _mm_insert_epi32(v, (int)u, 3);
    /* Stored by an asm the compiler cannot see through, so each use of out[] is a broadcast
     * load folded into its FMA, not a register broadcast on the shuffle port. */
    __asm__("vmovups %1, %0" : "=m"(*(float(*)[8])out) : "x"(_mm256_cvtph_ps(v)));
}

/* f16_pairs for four consecutive blocks (block_bytes apart) of R rows: out[k][2r], out[k][2r+1]
 * = the two halves at p + k*block_bytes + r*stride, gathered at once (the offsets must fit
 * 32 bits: f16_quads_fit). */
#define DS4N_F16_QUADS
static inline int f16_quads_fit(int64_t block_bytes, int64_t stride) {
    return 3 * block_bytes + 3 * stride < INT32_MAX;
}

DS4N_INLINE void f16_quads(const uint8_t *p, int64_t block_bytes, int64_t stride, const int R,
                           float out[4][8]) {
    const __m512i k = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __m512i r = _mm512_setr_epi32(0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3);
    const __m512i off = _mm512_add_epi32(_mm512_mullo_epi32(k, _mm512_set1_epi32((int)block_bytes)),
                                         _mm512_mullo_epi32(r, _mm512_set1_epi32((int)stride)));
    const __mmask16 rows = (__mmask16)(0x1111 * ((1u << R) - 1));
    const __m512i g = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), rows, off, p, 1);
    __asm__("vmovups %1, %0"
            : "=m"(*(float(*)[16])out[0])
            : "v"(_mm512_cvtph_ps(_mm512_castsi512_si256(g))));
    __asm__("vmovups %1, %0"
            : "=m"(*(float(*)[16])out[2])
            : "v"(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(g, 1))));
}

static inline void q8_codes(const int8_t *qs, v16 q[2]) {
    q[0] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(load16(qs)));
    q[1] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(load16(qs + 16)));
}

DS4N_INLINE void k45_codes(const uint8_t *qs, const uint8_t *qh, int s, v16 q[2]) {
    const uint8_t *p = qs + s / 2 * 32;
    const __m512i count = _mm512_set1_epi32(4 * (s % 2)), m4 = _mm512_set1_epi32(0x0f);
    __m512i a = _mm512_and_si512(_mm512_srlv_epi32(u8x16(p), count), m4);
    __m512i b = _mm512_and_si512(_mm512_srlv_epi32(u8x16(p + 16), count), m4);
    if (qh) { /* bit s of qh[l] is the fifth bit of code l */
        const __mmask32 k = _mm256_test_epi8_mask(load32(qh), _mm256_set1_epi8((char)(1 << s)));
        const __m512i b4 = _mm512_set1_epi32(0x10);
        a = _mm512_mask_or_epi32(a, (__mmask16)k, a, b4);
        b = _mm512_mask_or_epi32(b, (__mmask16)(k >> 16), b, b4);
    }
    q[0] = _mm512_cvtepi32_ps(a);
    q[1] = _mm512_cvtepi32_ps(b);
}

DS4N_INLINE void q6_codes(const block_q6_K *b, int h, int r, v16 q[2]) {
    __m256i lo = shr32(load32(b->ql + h * 64 + (r % 2) * 32), 4 * (r / 2));
    __m256i hi = shr32(load32(b->qh + h * 32), 2 * r);
    lo = _mm256_and_si256(lo, _mm256_set1_epi8(0x0f));
    hi = _mm256_and_si256(hi, _mm256_set1_epi8(3));
    __m256i v = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
    widen32(_mm256_sub_epi8(v, _mm256_set1_epi8(32)), q);
}

/* Q3_K: a clear high bit (bit 4h + j of hmask) subtracts 4, i.e. code = (lo | hbit << 2) - 4. */
DS4N_INLINE void k23_codes(const uint8_t *qs, const uint8_t *hmask, int h, int j, v16 q[2]) {
    __m256i v = _mm256_and_si256(shr32(load32(qs + 32 * h), 2 * j), _mm256_set1_epi8(3));
    if (hmask) {
        __m256i hb = _mm256_and_si256(shr32(load32(hmask), 4 * h + j), _mm256_set1_epi8(1));
        v = _mm256_sub_epi8(_mm256_or_si256(v, _mm256_slli_epi16(hb, 2)), _mm256_set1_epi8(4));
    }
    widen32(v, q);
}

/* Lattice points 2p and 2p+1 (bytes of idx) with their sign patterns (7 bits of meta each),
 * as 16 floats: the magnitudes widened, the signs flipped under a mask. */
static inline v16 iq2_pair(uint32_t idx, uint32_t meta, int p) {
    const int l0 = 2 * p, l1 = 2 * p + 1;
    __m128i g = _mm_loadl_epi64((const __m128i *)ds4n_iq2xxs_grid[(idx >> (8 * l0)) & 0xff]);
    uint64_t g1;
    memcpy(&g1, ds4n_iq2xxs_grid[(idx >> (8 * l1)) & 0xff], 8);
    g = _mm_insert_epi64(g, (long long)g1, 1);
    const __m512 mag = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(g));
    const __mmask16 neg = (__mmask16)(ds4n_iq2xxs_ksigns[(meta >> (7 * l0)) & 127] |
                                      ds4n_iq2xxs_ksigns[(meta >> (7 * l1)) & 127] << 8);
    return _mm512_mask_sub_ps(mag, neg, _mm512_setzero_ps(), mag);
}

static inline void iq2_codes(uint32_t idx, uint32_t meta, v16 q[2]) {
    q[0] = iq2_pair(idx, meta, 0);
    q[1] = iq2_pair(idx, meta, 1);
}

/* A 16-entry table indexed by each nibble: the table as 16 floats, one lane permute per 16
 * codes (the permute reads the low 4 bits of each lane, so the low nibbles need no mask). */
static inline void nibble_codes(const uint8_t *qs, const int8_t *table, v16 q[2]) {
    const __m512 values = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(load16(table)));
    const __m512i b = u8x16(qs);
    q[0] = _mm512_permutexvar_ps(b, values);
    q[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), values);
}

/* ---- Q4_K / Q5_K decode matvecs ------------------------------------------------------ */

/* The super-block's eight (d·sc, dmin·m) as lanes 2s, 2s+1: the 6-bit pairs unpacked from the
 * 12 scale bytes by two byte shuffles (low bits, and the two high bits of sub-blocks 4..7),
 * then one conversion and one multiply by (d, dmin) for all sixteen (the scalar products). */
DS4N_INLINE __m512 k45_scale_mins(const uint8_t *blk) {
    const __m128i S = _mm_loadu_si128((const __m128i *)(blk + 4)); /* scales[12] and 4 more */
    const __m128i P = _mm_shuffle_epi8(S, _mm_setr_epi8(0, 4, 1, 5, 2, 6, 3, 7, 8, 8, 9, 9, 10,
                                                        10, 11, 11));
    const __m128i Q = _mm_shuffle_epi8(S, _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 1,
                                                        5, 2, 6, 3, 7));
    /* sc (even bytes) and m (odd) of sub-blocks 0..3: 6 bits; of 4..7: a nibble (the m's the
     * high one) and the top two bits of the bytes Q picked, as bits 4..5 */
    const __m128i low = _mm_mask_blend_epi8(0xAA00, P, _mm_srli_epi16(P, 4));
    const __m128i high = _mm_and_si128(_mm_srli_epi16(Q, 2), _mm_set1_epi8(0x30));
    const __m128i keep = _mm_setr_epi8(63, 63, 63, 63, 63, 63, 63, 63, 15, 15, 15, 15, 15, 15,
                                       15, 15);
    const __m128i v = _mm_ternarylogic_epi32(low, keep, high, AND_OR);
    uint32_t u;
    memcpy(&u, blk, 4); /* d, dmin */
    const __m512 dd = _mm512_cvtph_ps(_mm256_set1_epi32((int)u));
    return _mm512_mul_ps(dd, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v)));
}

/* The codes of sub-blocks 2j (q[0], q[1]) and 2j+1 (q[2], q[3]): the low and high nibbles of
 * the same 32 bytes, widened once, left as the floats legacy_codes makes before its
 * subtraction: 2^23 + n (q[0], q[1]) and 2^19 + n (q[2], q[3]), n the code (with Q5_K's
 * fifth bit). k45_dot32 takes the bases off. */
DS4N_INLINE void k45_pair(const uint8_t *qs, const uint8_t *qh, int j, v16 q[4]) {
    const __m512i b0 = u8x16(qs + 32 * j), b1 = u8x16(qs + 32 * j + 16);
    const __m512i m_lo = _mm512_set1_epi32(0x0f), m_hi = _mm512_set1_epi32(0xf0);
    const __m512i e_lo = _mm512_set1_epi32(LO_BASE), e_hi = _mm512_set1_epi32(HI_BASE);
    __m512i v[4] = {_mm512_ternarylogic_epi32(b0, m_lo, e_lo, AND_OR),
                    _mm512_ternarylogic_epi32(b1, m_lo, e_lo, AND_OR),
                    _mm512_ternarylogic_epi32(b0, m_hi, e_hi, AND_OR),
                    _mm512_ternarylogic_epi32(b1, m_hi, e_hi, AND_OR)};
    if (qh) { /* bit s of qh[l] is the fifth bit of code l of sub-block s */
        const __m256i h = load32(qh);
        const __mmask32 k0 = _mm256_test_epi8_mask(h, _mm256_set1_epi8((char)(1 << (2 * j))));
        const __mmask32 k1 = _mm256_test_epi8_mask(h, _mm256_set1_epi8((char)(2 << (2 * j))));
        const __m512i f_lo = _mm512_set1_epi32(0x10), f_hi = _mm512_set1_epi32(0x100);
        v[0] = _mm512_mask_or_epi32(v[0], (__mmask16)k0, v[0], f_lo);
        v[1] = _mm512_mask_or_epi32(v[1], (__mmask16)(k0 >> 16), v[1], f_lo);
        v[2] = _mm512_mask_or_epi32(v[2], (__mmask16)k1, v[2], f_hi);
        v[3] = _mm512_mask_or_epi32(v[3], (__mmask16)(k1 >> 16), v[3], f_hi);
    }
    for (int i = 0; i < 4; i++) q[i] = _mm512_castsi512_ps(v[i]);
}

/* Lanes 1, 3, .., 15 = the super-block's eight per-32 sums of x, the rest 0: the mins' dot
 * with k45_scale_mins is one multiply-add (masked, so an infinite d·sc never meets a 0). */
static inline __m512 k45_xsums(const float *xsum) {
    return _mm512_maskz_expandloadu_ps(0xAAAA, xsum);
}

DS4N_INLINE __m512 k45_min_fma(__m512 sm, __m512 xs, __m512 accm) {
    return _mm512_mask3_fmadd_ps(sm, xs, accm, 0xAAAA);
}

/* 64 values of x for k45_dot32: x[0..16) .. x[48..64), and -2^23·x[0..16) and -2^19·x[32..48)
 * (exact: power-of-two scalings; shared by every row that meets these values). */
struct k45_x {
    __m512 x[4], n0, n2;
};

DS4N_INLINE void k45_load_x(const float *x, struct k45_x *v) {
    for (int i = 0; i < 4; i++) v->x[i] = _mm512_loadu_ps(x + 16 * i);
    v->n0 = _mm512_mul_ps(v->x[0], _mm512_set1_ps(-8388608.0f));
    v->n2 = _mm512_mul_ps(v->x[2], _mm512_set1_ps(-524288.0f));
}

/* Σq·x of the two 32-groups of a k45_pair, each as a vector: n·x + n'·x' per lane. The first
 * product is one FMA on the code's float before its subtraction, (2^k + n)·x - 2^k·x: exact
 * inside the FMA, rounded once, so it is the product n·x rounded (the subtraction costs
 * nothing there); the second adds n'·x' to it (an FMA, after the subtraction). Activations
 * beyond 2^104 would overflow -2^23·x: they give NaN (no working model comes near). */
DS4N_INLINE void k45_dot32(const v16 q[4], const struct k45_x *v, __m512 *d0, __m512 *d1) {
    const __m512 lo = _mm512_set1_ps(8388608.0f), hi = _mm512_set1_ps(524288.0f);
    *d0 = _mm512_fmadd_ps(_mm512_sub_ps(q[1], lo), v->x[1], _mm512_fmadd_ps(q[0], v->x[0], v->n0));
    *d1 = _mm512_fmadd_ps(_mm512_sub_ps(q[3], hi), v->x[3], _mm512_fmadd_ps(q[2], v->x[2], v->n2));
}

/* Stores v where the compiler cannot see it, so each later read of one lane is a broadcast
 * folded into its FMA rather than a shuffle (as f16_pairs). */
static inline void k45_park(float *out, __m512 v) {
    __asm__("vmovups %1, %0" : "=m"(*(float(*)[16])out) : "v"(v));
}

DS4N_INLINE void rows_k45(int five, const void *w, int64_t row_stride, const float *x,
                          const float *xsum, int64_t n, float *y, const int R) {
    const int64_t bb = five ? sizeof(block_q5_K) : sizeof(block_q4_K);
    __m512 acc[DS4N_MV_ROWS], accm[DS4N_MV_ROWS];
    _Alignas(64) float sm[DS4N_MV_ROWS][16];
    for (int r = 0; r < R; r++) acc[r] = accm[r] = _mm512_setzero_ps();
    const uint8_t *p = w;
    for (int64_t i = 0; i < n / QK_K; i++, p += bb, x += QK_K, xsum += 8) {
        const __m512 xs = k45_xsums(xsum);
        for (int r = 0; r < R; r++) {
            ds4n_prefetch_ahead(p + r * row_stride, (int64_t)bb);
            const __m512 v = k45_scale_mins(p + r * row_stride);
            accm[r] = k45_min_fma(v, xs, accm[r]);
            k45_park(sm[r], v);
        }
        for (int j = 0; j < 4; j++) {
            struct k45_x xv;
            k45_load_x(x + 64 * j, &xv);
            for (int r = 0; r < R; r++) {
                const uint8_t *b = p + r * row_stride;
                v16 q[4];
                __m512 d0, d1;
                k45_pair(five ? ((const block_q5_K *)b)->qs : ((const block_q4_K *)b)->qs,
                         five ? ((const block_q5_K *)b)->qh : NULL, j, q);
                k45_dot32(q, &xv, &d0, &d1);
                acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(sm[r][4 * j]), d0, acc[r]);
                acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(sm[r][4 * j + 2]), d1, acc[r]);
            }
        }
    }
    for (int r = 0; r < R; r++) y[r] = ds4n_hsum_avx512(acc[r]) - ds4n_hsum_avx512(accm[r]);
}

/* rows_k45's arithmetic for one row and T tokens, the super-block decoded once for all. */
DS4N_INLINE void cols_k45(int five, const void *w, const float *x, int64_t ldx,
                          const float *xsum, int64_t n, float *y, int64_t ldy, const int T) {
    const int64_t bb = five ? sizeof(block_q5_K) : sizeof(block_q4_K), nb = n / QK;
    __m512 acc[DS4N_SMALL_T], accm[DS4N_SMALL_T];
    _Alignas(64) float sm[16];
    for (int t = 0; t < T; t++) acc[t] = accm[t] = _mm512_setzero_ps();
    const uint8_t *p = w;
    for (int64_t i = 0; i < n / QK_K; i++, p += bb) {
        const __m512 v = k45_scale_mins(p);
        for (int t = 0; t < T; t++) accm[t] = k45_min_fma(v, k45_xsums(xsum + t * nb + 8 * i), accm[t]);
        k45_park(sm, v);
        const uint8_t *qs = five ? ((const block_q5_K *)p)->qs : ((const block_q4_K *)p)->qs;
        const uint8_t *qh = five ? ((const block_q5_K *)p)->qh : NULL;
        for (int j = 0; j < 4; j++) {
            v16 q[4];
            k45_pair(qs, qh, j, q);
            for (int t = 0; t < T; t++) {
                struct k45_x xv;
                __m512 d0, d1;
                k45_load_x(x + t * ldx + i * QK_K + 64 * j, &xv);
                k45_dot32(q, &xv, &d0, &d1);
                acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(sm[4 * j]), d0, acc[t]);
                acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(sm[4 * j + 2]), d1, acc[t]);
            }
        }
    }
    for (int t = 0; t < T; t++)
        y[t * ldy] = ds4n_hsum_avx512(acc[t]) - ds4n_hsum_avx512(accm[t]);
}

/* ---- Q6_K decode matvecs ---------------------------------------------------------------- */

#define SELECT 0xE4 /* vpternlog: c ? a : b, bit by bit */

/* The super-block's sixteen d·scale (the scalar products). */
DS4N_INLINE __m512 q6_scales(const block_q6_K *b) {
    const __m512 d = _mm512_set1_ps(f16(b->d));
    return _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(load16(b->scales))));
}

/* The super-block's 256 codes, offset removed, as signed bytes in value order: each half's
 * 64 ql bytes and 32 qh bytes (beside themselves shifted by 2, so bits 0..1 and 4..5 of each
 * byte hold the top bits of the codes in both of its nibbles) made into 128 codes with six
 * 512-bit byte operations (unpacking each 16 codes in 32-bit lanes took about four). */
DS4N_INLINE void q6_bytes(const block_q6_K *b, int8_t out[QK_K]) {
    const __m512i m33 = _mm512_set1_epi8(0x33), m0f = _mm512_set1_epi8(0x0f);
    const __m512i k32 = _mm512_set1_epi8(32);
    for (int h = 0; h < 2; h++) {
        const __m512i ql = _mm512_loadu_si512(b->ql + 64 * h);
        const __m256i qh = load32(b->qh + 32 * h);
        const __m512i top = _mm512_and_si512(
            _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1), m33);
        /* groups 0, 1 of the half: low nibbles, top bits 0..1 moved to 4..5 */
        const __m512i lo = _mm512_ternarylogic_epi32(ql, _mm512_slli_epi16(top, 4), m0f, SELECT);
        /* groups 2, 3: high nibbles, top bits already at 4..5 */
        const __m512i hi = _mm512_ternarylogic_epi32(_mm512_srli_epi16(ql, 4), top, m0f, SELECT);
        _mm512_storeu_si512(out + 128 * h, _mm512_sub_epi8(lo, k32));
        _mm512_storeu_si512(out + 128 * h + 64, _mm512_sub_epi8(hi, k32));
    }
}

/* 16 codes of q6_bytes as floats. */
static inline __m512 q6_16(const int8_t *codes) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(load16(codes)));
}

DS4N_INLINE void rows_q6(const void *w, int64_t row_stride, const float *x, const float *xsum,
                         int64_t n, float *y, const int R) {
    __m512 acc[DS4N_MV_ROWS];
    _Alignas(64) float sc[DS4N_MV_ROWS][16];
    _Alignas(64) int8_t codes[DS4N_MV_ROWS][QK_K];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    const uint8_t *p = w;
    for (int64_t i = 0; i < n / QK_K; i++, p += sizeof(block_q6_K), x += QK_K) {
        for (int r = 0; r < R; r++) {
            const block_q6_K *b = (const block_q6_K *)(p + r * row_stride);
            ds4n_prefetch_ahead(b, (int64_t)sizeof(block_q6_K));
            k45_park(sc[r], q6_scales(b));
            q6_bytes(b, codes[r]);
        }
        /* 16-groups in the order 2(4h + g) + u for h, u, g (cols_q6's, and the sums' before) */
        for (int h = 0; h < 2; h++)
            for (int u = 0; u < 2; u++)
                for (int r = 0; r < R; r++)
                    for (int g = 0; g < 4; g++) {
                        const int o = 128 * h + 32 * g + 16 * u;
                        acc[r] = _mm512_fmadd_ps(
                            _mm512_set1_ps(sc[r][2 * (4 * h + g) + u]),
                            _mm512_mul_ps(q6_16(codes[r] + o), _mm512_loadu_ps(x + o)), acc[r]);
                    }
    }
    for (int r = 0; r < R; r++) y[r] = ds4n_hsum_avx512(acc[r]);
}

/* rows_q6's arithmetic for one row and T tokens. */
DS4N_INLINE void cols_q6(const void *w, const float *x, int64_t ldx, const float *xsum,
                         int64_t n, float *y, int64_t ldy, const int T) {
    __m512 acc[DS4N_SMALL_T];
    _Alignas(64) float sc[16];
    for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_ps();
    const block_q6_K *b = w;
    for (int64_t i = 0; i < n / QK_K; i++) {
        k45_park(sc, q6_scales(&b[i]));
        _Alignas(64) int8_t codes[QK_K];
        q6_bytes(&b[i], codes);
        for (int h = 0; h < 2; h++)
            for (int u = 0; u < 2; u++) {
                v16 q[4];
                for (int g = 0; g < 4; g++) q[g] = q6_16(codes + 128 * h + 32 * g + 16 * u);
                for (int t = 0; t < T; t++)
                    for (int g = 0; g < 4; g++) {
                        const float *xt = x + t * ldx + i * QK_K + 128 * h + 32 * g + 16 * u;
                        acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(sc[2 * (4 * h + g) + u]),
                                                 _mm512_mul_ps(q[g], _mm512_loadu_ps(xt)), acc[t]);
                    }
            }
    }
    for (int t = 0; t < T; t++) y[t * ldy] = ds4n_hsum_avx512(acc[t]);
}

#define DS4N_OWN_K45_MATVEC
#define DS4N_OWN_Q6_K_MATVEC
#define DS4N_TILE_ACC 24 /* of 32 zmm: a row's block is 2, and the x operands load from L1 */
/* The block formats' rows kernel requests each stream's blocks DS4N_STREAM_AHEAD ahead, as
 * this file's K-quant rows kernels do (prefetch.h; measured on Zen 4 only). */
#define DS4N_ROWS_LEAD
#include "quants_generic.h"

DS4N_ROWS_KERNEL(q4_K, rows_k45, 0)
DS4N_ROWS_KERNEL(q5_K, rows_k45, 1)
DS4N_COLS_KERNEL(q4_K, cols_k45, 0)
DS4N_COLS_KERNEL(q5_K, cols_k45, 1)
#define rows_q6_body(unused, ...) rows_q6(__VA_ARGS__)
DS4N_ROWS_KERNEL(q6_K_R, rows_q6_body, 0)
#define cols_q6_body(unused, ...) cols_q6(__VA_ARGS__)
DS4N_COLS_KERNEL(q6_K_T, cols_q6_body, 0)

/* hw_prefetch: on Zen 4 the hand prefetch of short rows (matmul.c) measured 5-23 % slower than
 * the hardware prefetchers alone, as on Zen 3 (docs/benchmarks-real-sizes.md, "Decode at the
 * bound on Zen 4"). */
DS4N_DEFINE_KERNEL_SET(ds4n_avx512_set, ds4n_tile_avx512, DS4N_TILE_COLS_MAX, 1)
