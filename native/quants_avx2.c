/* AVX2+FMA+F16C row kernels (compiled with those flags, chosen at run time): the vector
 * primitives and code unpackers quants_generic.h builds every type's kernels from. */
#include "quants_avx2.h"
#include "iq2xxs_tables.h"
#include "nibble_tables.h"

static inline float f16(uint16_t h) { return _cvtsh_ss(h); }

/* ---- primitives ------------------------------------------------------------------------ */

typedef __m256 vacc;
typedef struct {
    __m256 v[2];
} v16;

static inline vacc vzero(void) { return _mm256_setzero_ps(); }
static inline vacc vadd(vacc a, vacc b) { return _mm256_add_ps(a, b); }
static inline vacc vsub(vacc a, vacc b) { return _mm256_sub_ps(a, b); }
static inline float vhsum(vacc a) { return ds4n_hsum_avx2(a); }
static inline vacc vfma_s(vacc acc, float s, vacc v) {
    return _mm256_fmadd_ps(_mm256_set1_ps(s), v, acc);
}

static inline vacc vfma_m(vacc acc, const float *s, vacc v) { return vfma_s(acc, *s, v); }

static inline vacc v16_dot(v16 q, const float *x) {
    __m256 lo = _mm256_mul_ps(q.v[0], _mm256_loadu_ps(x));
    return _mm256_fmadd_ps(q.v[1], _mm256_loadu_ps(x + 8), lo);
}

/* acc + q·x, lane-wise (no horizontal sum). */
static inline vacc v16_fma(vacc acc, v16 q, const float *x) {
    acc = _mm256_fmadd_ps(q.v[0], _mm256_loadu_ps(x), acc);
    return _mm256_fmadd_ps(q.v[1], _mm256_loadu_ps(x + 8), acc);
}

static inline vacc v16_sum(const float *x) {
    return _mm256_add_ps(_mm256_loadu_ps(x), _mm256_loadu_ps(x + 8));
}

static inline void v16_store(float *y, v16 q, float d) {
    __m256 vd = _mm256_set1_ps(d);
    _mm256_storeu_ps(y, _mm256_mul_ps(vd, q.v[0]));
    _mm256_storeu_ps(y + 8, _mm256_mul_ps(vd, q.v[1]));
}

static inline void v16_store_affine(float *y, v16 q, float d, float m) {
    __m256 vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(m);
    _mm256_storeu_ps(y, _mm256_add_ps(_mm256_mul_ps(vd, q.v[0]), vm));
    _mm256_storeu_ps(y + 8, _mm256_add_ps(_mm256_mul_ps(vd, q.v[1]), vm));
}

/* ---- float rows ------------------------------------------------------------------------ */

DS4N_INLINE __m256 load_float8(int type, const void *p, int64_t i) {
    switch (type) {
    case DS4N_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
    case DS4N_BF16: {
        __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + i));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
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

/* ---- code unpackers -------------------------------------------------------------------- */

static inline __m128i load8(const uint8_t *p) { return _mm_loadl_epi64((const __m128i *)p); }
static inline __m256i load32(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }
static inline __m256 i8x8(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)); }

/* 16 / 32 signed bytes as floats. */
static inline v16 widen16(__m128i b) {
    v16 q = {{i8x8(b), i8x8(_mm_srli_si128(b, 8))}};
    return q;
}
static inline void widen32(__m256i b, v16 q[2]) {
    q[0] = widen16(_mm256_castsi256_si128(b));
    q[1] = widen16(_mm256_extracti128_si256(b, 1));
}

/* Byte-wise right shift of 32 bytes by a run-time count (bits shifted in are masked off). */
static inline __m256i shr32(__m256i v, int count) {
    return _mm256_srl_epi16(v, _mm_cvtsi32_si128(count));
}

/* 16 bits -> 16 bytes, 0x10 where the bit is set (the 5th bit of Q5 codes). */
static inline __m128i fifth_bits(uint32_t bits) {
    __m128i v = _mm_shuffle_epi8(_mm_cvtsi32_si128((int)bits),
                                 _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1));
    __m128i mask = _mm_set1_epi64x((int64_t)0x8040201008040201ull);
    return _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(v, mask), mask), _mm_set1_epi8(0x10));
}

DS4N_INLINE void legacy_codes(const uint8_t *qs, const uint8_t *qh, int offset, v16 q[2]) {
    if (!qh) {
        /* Bytes straight to 32-bit lanes (vpmovzxbd takes its 8 bytes as a load), nibbles
         * split there: fewer shuffles than splitting bytes and widening each half. */
        const __m256i m4 = _mm256_set1_epi32(0x0f), off = _mm256_set1_epi32(offset);
        const __m256i a = _mm256_cvtepu8_epi32(load8(qs)), b = _mm256_cvtepu8_epi32(load8(qs + 8));
        const __m256i c[4] = {_mm256_and_si256(a, m4), _mm256_and_si256(b, m4),
                              _mm256_srli_epi32(a, 4), _mm256_srli_epi32(b, 4)};
        for (int k = 0; k < 4; k++)
            q[k / 2].v[k % 2] = _mm256_cvtepi32_ps(offset ? _mm256_sub_epi32(c[k], off) : c[k]);
        return;
    }
    __m128i bytes = _mm_loadu_si128((const __m128i *)qs), m4 = _mm_set1_epi8(0x0f);
    __m128i lo = _mm_and_si128(bytes, m4), hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), m4);
    if (qh) {
        uint32_t h;
        memcpy(&h, qh, 4);
        lo = _mm_or_si128(lo, fifth_bits(h & 0xffff));
        hi = _mm_or_si128(hi, fifth_bits(h >> 16));
    }
    q[0] = widen16(_mm_sub_epi8(lo, _mm_set1_epi8((char)offset)));
    q[1] = widen16(_mm_sub_epi8(hi, _mm_set1_epi8((char)offset)));
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
    _mm256_storeu_ps(out, _mm256_cvtph_ps(v));
}

/* Straight from memory: vpmovsxbd takes its 8 bytes as a load, no shuffles. */
static inline void q8_codes(const int8_t *qs, v16 q[2]) {
    for (int k = 0; k < 4; k++) q[k / 2].v[k % 2] = i8x8(load8((const uint8_t *)qs + 8 * k));
}

DS4N_INLINE void k45_codes(const uint8_t *qs, const uint8_t *qh, int s, v16 q[2]) {
    __m256i v = shr32(load32(qs + s / 2 * 32), 4 * (s % 2));
    v = _mm256_and_si256(v, _mm256_set1_epi8(0x0f));
    if (qh) {
        __m256i h = _mm256_and_si256(shr32(load32(qh), s), _mm256_set1_epi8(1));
        v = _mm256_or_si256(v, _mm256_slli_epi16(h, 4));
    }
    widen32(v, q);
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

/* Lattice point l (byte l of idx) with sign pattern l (7 bits of meta), as 8 floats. */
static inline __m256 iq2_point(uint32_t idx, uint32_t meta, int l) {
    const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    __m128i magnitudes = load8(ds4n_iq2xxs_grid[(idx >> (8 * l)) & 0xff]);
    __m256 grid = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(magnitudes));
    __m256i s = _mm256_set1_epi32(ds4n_iq2xxs_ksigns[(meta >> (7 * l)) & 127]);
    __m256i neg = _mm256_cmpeq_epi32(_mm256_and_si256(s, bit), bit);
    neg = _mm256_and_si256(neg, _mm256_set1_epi32((int)0x80000000u));
    return _mm256_xor_ps(grid, _mm256_castsi256_ps(neg));
}

static inline void iq2_codes(uint32_t idx, uint32_t meta, v16 q[2]) {
    for (int l = 0; l < 4; l++) q[l / 2].v[l % 2] = iq2_point(idx, meta, l);
}

/* A 16-entry byte table indexed by each nibble: one pshufb per 16 codes. */
static inline void nibble_codes(const uint8_t *qs, const int8_t *table, v16 q[2]) {
    __m128i bytes = _mm_loadu_si128((const __m128i *)qs), m4 = _mm_set1_epi8(0x0f);
    __m128i values = _mm_loadu_si128((const __m128i *)table);
    q[0] = widen16(_mm_shuffle_epi8(values, _mm_and_si128(bytes, m4)));
    q[1] = widen16(_mm_shuffle_epi8(values, _mm_and_si128(_mm_srli_epi16(bytes, 4), m4)));
}

#define DS4N_OWN_LEGACY_MATVEC
#define DS4N_OWN_K45_MATVEC
#define DS4N_OWN_Q6_K_MATVEC
#define DS4N_TILE_ACC 8 /* of 16 ymm: a row's block is 4, its min sums 1 more */
#include "quants_generic.h"

/* ---- decode matvecs of the f16-scaled 32-code types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 -------
 *
 * Zen 3 has two FMA pipes and two FADD pipes; a token's 32-code block costs four FMAs for
 * Σq·x and one for the scale whatever the unpacking, so the unpackers below aim at few
 * operations off the FMA pipes (a batch of T tokens shares one unpacking between 5T FMAs),
 * and the min of the affine types is one FMA per block for every row of a pass (lanes =
 * rows) or every token of a batch (lanes = tokens, from the block-major sums). */

#define LO_BASE 0x4B000000 /* 2^23: a code in its low mantissa bits is the float 2^23 + code */
#define HI_BASE 0x49000000 /* 2^19: mantissa step 1/16, so a code kept in bits 4..7 reads as
                            * 2^19 + code; its bits are a subset of LO_BASE's */

/* Stores v where the compiler cannot see through it, so each later use of one lane is a
 * broadcast load (a load-port operation) rather than a shuffle. */
static inline void park8(float *out, __m256 v) {
    __asm__("vmovups %1, %0" : "=m"(*(float(*)[8])out) : "x"(v));
}

/* 32 bytes of signed codes at p as four vectors of 8 floats (vpmovsxbd takes its 8 bytes
 * as a load, no shuffle). */
static inline void i8_codes(const void *p, __m256 c[4]) {
    for (int k = 0; k < 4; k++) c[k] = i8x8(load8((const uint8_t *)p + 8 * k));
}

/* q5_fifth[b][i] = 16·(bit i of b) - 16: a Q5_0 code's fifth bit with the offset (Q5_1
 * adds the 16 back). */
#define Q5F(b, i) (((b) >> (i) & 1) ? 0 : -16)
#define Q5ROW(b) {Q5F(b, 0), Q5F(b, 1), Q5F(b, 2), Q5F(b, 3), Q5F(b, 4), Q5F(b, 5), Q5F(b, 6), Q5F(b, 7)}
#define Q5ROW4(b) Q5ROW(b), Q5ROW((b) + 1), Q5ROW((b) + 2), Q5ROW((b) + 3)
#define Q5ROW16(b) Q5ROW4(b), Q5ROW4((b) + 4), Q5ROW4((b) + 8), Q5ROW4((b) + 12)
#define Q5ROW64(b) Q5ROW16(b), Q5ROW16((b) + 16), Q5ROW16((b) + 32), Q5ROW16((b) + 48)
static _Alignas(32) const int32_t q5_fifth[256][8] = {Q5ROW64(0), Q5ROW64(64), Q5ROW64(128),
                                                       Q5ROW64(192)};

/* Codes 8k..8k+8 of the block at blk as c[k], the type's offset removed. */
DS4N_INLINE void block_codes(int type, const uint8_t *blk, __m256 c[4]) {
    switch (type) {
    case DS4N_Q4_0:
    case DS4N_Q4_1: {
        /* Byte l of qs (zero-extended to a lane) holds codes l and l + 16. */
        const uint8_t *qs = type == DS4N_Q4_0 ? blk + 2 : blk + 4;
        const __m256i a = _mm256_cvtepu8_epi32(load8(qs)), b = _mm256_cvtepu8_epi32(load8(qs + 8));
        if (type == DS4N_Q4_1) { /* no offset: AND / shift, convert */
            const __m256i m4 = _mm256_set1_epi32(0x0f);
            c[0] = _mm256_cvtepi32_ps(_mm256_and_si256(a, m4));
            c[1] = _mm256_cvtepi32_ps(_mm256_and_si256(b, m4));
            c[2] = _mm256_cvtepi32_ps(_mm256_srli_epi32(a, 4));
            c[3] = _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4));
            break;
        }
        /* Offset 8: both nibbles placed under their base (one OR, one AND each, no shift)
         * and base + 8 subtracted, exactly (both operands in [2^k, 2^(k+1)): Sterbenz). */
        const __m256i e = _mm256_set1_epi32(LO_BASE);
        const __m256i k_lo = _mm256_set1_epi32(LO_BASE | 0x0f), k_hi = _mm256_set1_epi32(HI_BASE | 0xf0);
        const __m256 o_lo = _mm256_set1_ps(8388608.0f + 8.0f), o_hi = _mm256_set1_ps(524288.0f + 8.0f);
        const __m256i ea = _mm256_or_si256(a, e), eb = _mm256_or_si256(b, e);
        c[0] = _mm256_sub_ps(_mm256_castsi256_ps(_mm256_and_si256(ea, k_lo)), o_lo);
        c[1] = _mm256_sub_ps(_mm256_castsi256_ps(_mm256_and_si256(eb, k_lo)), o_lo);
        c[2] = _mm256_sub_ps(_mm256_castsi256_ps(_mm256_and_si256(ea, k_hi)), o_hi);
        c[3] = _mm256_sub_ps(_mm256_castsi256_ps(_mm256_and_si256(eb, k_hi)), o_hi);
        break;
    }
    case DS4N_Q5_0:
    case DS4N_Q5_1: {
        /* As Q4_1 (byte l of qs in lane l: codes l and l + 16), each qh byte's eight fifth
         * bits and Q5_0's offset added from a table row (a load, no shuffle or shift). */
        const uint8_t *qh = type == DS4N_Q5_0 ? blk + 2 : blk + 4, *qs = qh + 4;
        const __m256i m4 = _mm256_set1_epi32(0x0f), f = _mm256_set1_epi32(16);
        for (int half = 0; half < 2; half++) { /* codes 8·half.., and 16 + 8·half.. */
            const __m256i a = _mm256_cvtepu8_epi32(load8(qs + 8 * half));
            const __m256i *t_lo = (const __m256i *)q5_fifth[qh[half]];
            const __m256i *t_hi = (const __m256i *)q5_fifth[qh[2 + half]];
            __m256i lo = _mm256_add_epi32(_mm256_and_si256(a, m4), _mm256_load_si256(t_lo));
            __m256i hi = _mm256_add_epi32(_mm256_srli_epi32(a, 4), _mm256_load_si256(t_hi));
            if (type == DS4N_Q5_1) lo = _mm256_add_epi32(lo, f), hi = _mm256_add_epi32(hi, f);
            c[half] = _mm256_cvtepi32_ps(lo);
            c[2 + half] = _mm256_cvtepi32_ps(hi);
        }
        break;
    }
    default: /* DS4N_Q8_0 */
        i8_codes(blk + 2, c);
    }
}

/* Σ c·x over one block, as a vector: one multiply and three FMAs in one chain (T tokens of a
 * batch, or R rows, give the chains to overlap). */
static inline __m256 codes_dot(const __m256 c[4], const float *x) {
    __m256 s = _mm256_mul_ps(c[0], _mm256_loadu_ps(x));
    s = _mm256_fmadd_ps(c[1], _mm256_loadu_ps(x + 8), s);
    s = _mm256_fmadd_ps(c[2], _mm256_loadu_ps(x + 16), s);
    return _mm256_fmadd_ps(c[3], _mm256_loadu_ps(x + 24), s);
}

/* R rows, row_stride bytes apart: y[r] = Σ_blocks d·Σc·x (+ the min's Σ m·xsum: lane 2r+1
 * of one accumulator, one FMA per block for all R rows). */
DS4N_INLINE void rows_f16_legacy(int type, int64_t bb, const void *w, int64_t row_stride,
                                 const float *x, const float *xsum, int64_t n, float *y,
                                 const int R) {
    __m256 acc[DS4N_MV_ROWS], accm = _mm256_setzero_ps();
    _Alignas(32) float dm[8];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    const uint8_t *p = w;
    for (int64_t i = 0; i < n / QK; i++, p += bb, x += QK) {
        uint32_t u;
        memcpy(&u, p, 4);
        __m128i h = _mm_cvtsi32_si128((int)u);
        if (R > 1) memcpy(&u, p + row_stride, 4), h = _mm_insert_epi32(h, (int)u, 1);
        if (R > 2) memcpy(&u, p + 2 * row_stride, 4), h = _mm_insert_epi32(h, (int)u, 2);
        if (R > 3) memcpy(&u, p + 3 * row_stride, 4), h = _mm_insert_epi32(h, (int)u, 3);
        const __m256 v = _mm256_cvtph_ps(h); /* d, m (or code bytes) of each row */
        park8(dm, v);
        if (is_affine(type)) accm = _mm256_fmadd_ps(v, _mm256_broadcast_ss(xsum + i), accm);
        for (int r = 0; r < R; r++) {
            __m256 c[4];
            block_codes(type, p + r * row_stride, c);
            acc[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(dm + 2 * r), codes_dot(c, x), acc[r]);
        }
    }
    _Alignas(32) float mins[8];
    _mm256_store_ps(mins, accm);
    for (int r = 0; r < R; r++)
        y[r] = is_affine(type) ? ds4n_hsum_avx2(acc[r]) + mins[2 * r + 1] : ds4n_hsum_avx2(acc[r]);
}

/* Tokens t0 .. t0+G of tile_f16_legacy: rows_f16_legacy's arithmetic for R rows and G tokens,
 * each block of each row unpacked once; row r's min term has the tokens as its lanes (from
 * the block-major sums xs[i*T + t]: one load and one FMA per block and row). */
DS4N_INLINE void tile_f16_legacy_pass(int type, int64_t bb, const uint8_t *w, int64_t row_stride,
                                      const float *x, int64_t ldx, const float *xs, int T,
                                      int64_t n, float *y, int64_t ldy, const int R, const int G) {
    __m256 acc[DS4N_TILE_ACC], accm[DS4N_MV_ROWS]; /* row r, token t at r*G + t */
    for (int r = 0; r < R; r++) {
        accm[r] = _mm256_setzero_ps();
        for (int t = 0; t < G; t++) acc[r * G + t] = _mm256_setzero_ps();
    }
    /* Each row's d and m converted on its own (as cols did): park8's store of the R rows'
     * made GCC keep the accumulators in memory. */
    const uint8_t *p = w;
    for (int64_t i = 0; i < n / QK; i++, p += bb, x += QK, xs += T) {
        for (int r = 0; r < R; r++) {
            const uint8_t *blk = p + r * row_stride;
            uint32_t u;
            memcpy(&u, blk, 4);
            const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128((int)u)); /* d, m (or code bytes) */
            if (is_affine(type))
                accm[r] = _mm256_fmadd_ps(_mm256_broadcastss_ps(_mm_movehdup_ps(dm)),
                                          _mm256_loadu_ps(xs), accm[r]);
            const __m256 d = _mm256_broadcastss_ps(dm);
            __m256 c[4];
            block_codes(type, blk, c);
            for (int t = 0; t < G; t++)
                acc[r * G + t] = _mm256_fmadd_ps(d, codes_dot(c, x + t * ldx), acc[r * G + t]);
        }
    }
    for (int r = 0; r < R; r++) {
        _Alignas(32) float mins[8];
        _mm256_store_ps(mins, accm[r]);
        for (int t = 0; t < G; t++)
            y[t * ldy + r] = is_affine(type) ? ds4n_hsum_avx2(acc[r * G + t]) + mins[t]
                                             : ds4n_hsum_avx2(acc[r * G + t]);
    }
}

/* Bytes of x (T tokens of n floats) a one-row pass may read for every row and still find in
 * L1 (32 KiB on Zen 3, with room for the rows' blocks). */
#define X_L1_BYTES (24 * 1024)

/* rows_f16_legacy's arithmetic for R rows and T tokens: one tile when its R·T accumulators fit
 * DS4N_TILE_ACC, else tiles of two rows with every token while those fit (T = 3, 4), else row by
 * row with every token, unless the T tokens' x would not stay in L1 (the down projection's 1536
 * values at T = 8: 48 KiB), when each pair of rows takes the tokens in two halves. A pass of
 * every token unpacks each block once: a 4 x 2 pass (blocks unpacked twice) and its spills
 * measured slower than one row at T = 3..8 with x in L1. Zen 3, paired in one process (docs/
 * serving-loop.md, "The small-batch step on AVX2"): two rows at T = 3 2-6 % cheaper than one
 * (x loaded once for both), at T = 4 0-4 %; at T = 2 tiles of two rows or one 0-11 % dearer
 * than the 4 x 2 tile; the halves at T = 8 12 % cheaper with 1536 values, 10 % dearer with
 * 576 (x in L1). */
DS4N_INLINE void tile_f16_legacy(int type, int64_t bb, const void *w, int64_t row_stride,
                                 const float *x, int64_t ldx, const float *xsum, int64_t n,
                                 float *y, int64_t ldy, const int R, const int T) {
    const float *xs = xsum + T * (n / QK);
    if (R * T <= DS4N_TILE_ACC) {
        tile_f16_legacy_pass(type, bb, w, row_stride, x, ldx, xs, T, n, y, ldy, R, T);
        return;
    }
    if (2 * T <= DS4N_TILE_ACC) { /* T = 3, 4: pairs of rows, then the odd one */
        int r = 0;
        for (; r + 2 <= R; r += 2)
            tile_f16_legacy_pass(type, bb, (const uint8_t *)w + r * row_stride, row_stride, x,
                                 ldx, xs, T, n, y + r, ldy, 2, T);
        if (r < R)
            tile_f16_legacy_pass(type, bb, (const uint8_t *)w + r * row_stride, row_stride, x,
                                 ldx, xs, T, n, y + r, ldy, 1, T);
        return;
    }
    if (T * n * (int64_t)sizeof(float) > X_L1_BYTES) { /* two passes of two rows, T/2 tokens */
        const int G = (T + 1) / 2;
        int r = 0;
        for (; r + 2 <= R; r += 2) {
            const uint8_t *wr = (const uint8_t *)w + r * row_stride;
            tile_f16_legacy_pass(type, bb, wr, row_stride, x, ldx, xs, T, n, y + r, ldy, 2, G);
            tile_f16_legacy_pass(type, bb, wr, row_stride, x + G * ldx, ldx, xs + G, T, n,
                                 y + r + G * ldy, ldy, 2, T - G);
        }
        for (; r < R; r++)
            tile_f16_legacy_pass(type, bb, (const uint8_t *)w + r * row_stride, row_stride, x, ldx,
                                 xs, T, n, y + r, ldy, 1, T);
        return;
    }
    for (int r = 0; r < R; r++)
        tile_f16_legacy_pass(type, bb, (const uint8_t *)w + r * row_stride, row_stride, x, ldx,
                             xs, T, n, y + r, ldy, 1, T);
}

/* ---- Q4_K / Q5_K decode matvecs ------------------------------------------------------ */

/* The super-block's eight d·sc (parked at dsc) and dmin·m (returned): the 6-bit pairs
 * unpacked from the 12 scale bytes by two byte shuffles once for all sub-blocks, then one
 * conversion and multiply per eight (the scalar kernels' products). */
DS4N_INLINE __m256 k45_scales(const uint8_t *blk, float *dsc) {
    const __m128i S = _mm_loadu_si128((const __m128i *)(blk + 4)); /* scales[12] and 4 more */
    /* sc 0..3 and m 0..3 are the low 6 bits of bytes 0..3 and 4..7; sc 4..7 and m 4..7 the
     * low and high nibbles of bytes 8..11, with the top two bits of bytes 0..3 and 4..7 */
    const __m128i A = _mm_shuffle_epi8(S, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9,
                                                        10, 11));
    const __m128i B = _mm_shuffle_epi8(S, _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1,
                                                        -1, 4, 5, 6, 7));
    const __m128i low = _mm_and_si128(_mm_blend_epi32(A, _mm_srli_epi16(A, 4), 0x8),
                                      _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63,
                                                    63, 15, 15, 15, 15));
    const __m128i high = _mm_and_si128(_mm_srli_epi16(B, 2), _mm_set1_epi8(0x30));
    _Alignas(16) uint8_t scm[16]; /* sc 0..7, m 0..7 */
    _mm_store_si128((__m128i *)scm, _mm_or_si128(low, high));
    uint32_t u;
    memcpy(&u, blk, 4); /* d, dmin */
    const __m128 dd = _mm_cvtph_ps(_mm_cvtsi32_si128((int)u));
    const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(load8(scm)));
    const __m256 m = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(load8(scm + 8)));
    park8(dsc, _mm256_mul_ps(_mm256_broadcastss_ps(dd), sc));
    return _mm256_mul_ps(_mm256_broadcastss_ps(_mm_movehdup_ps(dd)), m);
}

/* Sub-blocks 2j (c[0..4]) and 2j+1 (c[4..8]): the low and high nibbles of the same 32 bytes,
 * each byte widened once; Q5_K's fifth bits (bit s of qh[l]: code l of sub-block s) moved to
 * bit 4 of the lanes. */
DS4N_INLINE void k45_pair(const uint8_t *qs, const uint8_t *qh, int j, __m256 c[8]) {
    const __m256i m4 = _mm256_set1_epi32(0x0f), b4 = _mm256_set1_epi32(0x10);
    for (int u = 0; u < 4; u++) {
        const __m256i a = _mm256_cvtepu8_epi32(load8(qs + 32 * j + 8 * u));
        __m256i lo = _mm256_and_si256(a, m4), hi = _mm256_srli_epi32(a, 4);
        if (qh) {
            const __m256i h = _mm256_cvtepu8_epi32(load8(qh + 8 * u));
            /* bit 2j to bit 4, and bit 2j+1 to bit 4 */
            const __m256i h_lo = j < 2 ? _mm256_slli_epi32(h, 4 - 2 * j) : _mm256_srli_epi32(h, 2 * j - 4);
            const __m256i h_hi = j < 2 ? _mm256_slli_epi32(h, 3 - 2 * j) : _mm256_srli_epi32(h, 2 * j - 3);
            lo = _mm256_or_si256(lo, _mm256_and_si256(h_lo, b4));
            hi = _mm256_or_si256(hi, _mm256_and_si256(h_hi, b4));
        }
        c[u] = _mm256_cvtepi32_ps(lo);
        c[4 + u] = _mm256_cvtepi32_ps(hi);
    }
}

/* R rows: each super-block's mins enter the accumulator first, as -dmin·m · the eight
 * per-32 sums (one FMA), then every sub-block's d·sc·Σq·x. */
DS4N_INLINE void rows_k45(int five, const void *w, int64_t row_stride, const float *x,
                          const float *xsum, int64_t n, float *y, const int R) {
    const int64_t bb = five ? sizeof(block_q5_K) : sizeof(block_q4_K);
    __m256 acc[DS4N_MV_ROWS];
    _Alignas(32) float dsc[DS4N_MV_ROWS][8];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    const uint8_t *p = w;
    for (int64_t i = 0; i < n / QK_K; i++, p += bb, x += QK_K, xsum += 8) {
        const __m256 xs = _mm256_loadu_ps(xsum);
        for (int r = 0; r < R; r++)
            acc[r] = _mm256_fnmadd_ps(k45_scales(p + r * row_stride, dsc[r]), xs, acc[r]);
        for (int j = 0; j < 4; j++)
            for (int r = 0; r < R; r++) {
                const uint8_t *b = p + r * row_stride;
                __m256 c[8];
                k45_pair(five ? ((const block_q5_K *)b)->qs : ((const block_q4_K *)b)->qs,
                         five ? ((const block_q5_K *)b)->qh : NULL, j, c);
                acc[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(&dsc[r][2 * j]),
                                         codes_dot(c, x + 64 * j), acc[r]);
                acc[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(&dsc[r][2 * j + 1]),
                                         codes_dot(c + 4, x + 64 * j + 32), acc[r]);
            }
    }
    for (int r = 0; r < R; r++) y[r] = ds4n_hsum_avx2(acc[r]);
}

/* rows_k45's arithmetic for one row and T tokens, each super-block unpacked once. */
DS4N_INLINE void cols_k45(int five, const void *w, const float *x, int64_t ldx,
                          const float *xsum, int64_t n, float *y, int64_t ldy, const int T) {
    const int64_t bb = five ? sizeof(block_q5_K) : sizeof(block_q4_K), nb = n / QK;
    __m256 acc[DS4N_SMALL_T];
    _Alignas(32) float dsc[8];
    for (int t = 0; t < T; t++) acc[t] = _mm256_setzero_ps();
    const uint8_t *p = w;
    for (int64_t i = 0; i < n / QK_K; i++, p += bb) {
        const __m256 dm = k45_scales(p, dsc);
        for (int t = 0; t < T; t++)
            acc[t] = _mm256_fnmadd_ps(dm, _mm256_loadu_ps(xsum + t * nb + 8 * i), acc[t]);
        const uint8_t *qs = five ? ((const block_q5_K *)p)->qs : ((const block_q4_K *)p)->qs;
        const uint8_t *qh = five ? ((const block_q5_K *)p)->qh : NULL;
        for (int j = 0; j < 4; j++) {
            __m256 c[8];
            k45_pair(qs, qh, j, c);
            const __m256 s0 = _mm256_broadcast_ss(&dsc[2 * j]), s1 = _mm256_broadcast_ss(&dsc[2 * j + 1]);
            for (int t = 0; t < T; t++) {
                const float *xt = x + t * ldx + i * QK_K + 64 * j;
                acc[t] = _mm256_fmadd_ps(s0, codes_dot(c, xt), acc[t]);
                acc[t] = _mm256_fmadd_ps(s1, codes_dot(c + 4, xt + 32), acc[t]);
            }
        }
    }
    for (int t = 0; t < T; t++) y[t * ldy] = ds4n_hsum_avx2(acc[t]);
}

/* ---- Q6_K decode matvecs ---------------------------------------------------------------- */

/* The super-block's sixteen d·scale, parked (the scalar products). */
DS4N_INLINE void q6_scales(const block_q6_K *b, float *sc) {
    const __m256 d = _mm256_set1_ps(f16(b->d));
    park8(sc, _mm256_mul_ps(d, i8x8(load8((const uint8_t *)b->scales))));
    park8(sc + 8, _mm256_mul_ps(d, i8x8(load8((const uint8_t *)b->scales + 8))));
}

/* Σ over codes 16v..16v+16 of the four groups of half h (c: u = 2v, then 2v+1), each group's
 * 16-scale applied: acc += sc·(c_a·x_a + c_b·x_b). */
DS4N_INLINE __m256 q6_group16(__m256 acc, const __m256 ca[4], const __m256 cb[4], const float *sc,
                              const float *x, int h, int v) {
    for (int r = 0; r < 4; r++) {
        const float *xr = x + 128 * h + 32 * r + 16 * v;
        __m256 s = _mm256_mul_ps(ca[r], _mm256_loadu_ps(xr));
        s = _mm256_fmadd_ps(cb[r], _mm256_loadu_ps(xr + 8), s);
        acc = _mm256_fmadd_ps(_mm256_broadcast_ss(sc + 2 * (4 * h + r) + v), s, acc);
    }
    return acc;
}

/* The super-block's 256 codes, offset removed, as signed bytes in value order, built 32 at a
 * time with byte operations (about six per 32 codes; unpacking them in 32-bit lanes took
 * about five per 8), to be widened 8 at a time. */
DS4N_INLINE void q6_bytes(const block_q6_K *b, int8_t out[QK_K]) {
    const __m256i m03 = _mm256_set1_epi8(0x03), m0f = _mm256_set1_epi8(0x0f);
    const __m256i m30 = _mm256_set1_epi8(0x30), k32 = _mm256_set1_epi8(32);
    for (int h = 0; h < 2; h++) {
        const __m256i l0 = load32(b->ql + 64 * h), l1 = load32(b->ql + 64 * h + 32);
        const __m256i q = load32(b->qh + 32 * h), q2 = _mm256_srli_epi16(q, 2);
        /* group r: a nibble of l0 (r even) or l1 (r odd), bits 2r, 2r+1 of q as bits 4, 5 */
        const __m256i g[4] = {
            _mm256_or_si256(_mm256_and_si256(l0, m0f), _mm256_slli_epi16(_mm256_and_si256(q, m03), 4)),
            _mm256_or_si256(_mm256_and_si256(l1, m0f), _mm256_slli_epi16(_mm256_and_si256(q2, m03), 4)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m0f), _mm256_and_si256(q, m30)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m0f), _mm256_and_si256(q2, m30)),
        };
        for (int r = 0; r < 4; r++)
            _mm256_storeu_si256((__m256i *)(out + 128 * h + 32 * r), _mm256_sub_epi8(g[r], k32));
    }
}

DS4N_INLINE void rows_q6(const void *w, int64_t row_stride, const float *x, const float *xsum,
                         int64_t n, float *y, const int R) {
    __m256 acc[DS4N_MV_ROWS];
    _Alignas(32) float sc[DS4N_MV_ROWS][16];
    _Alignas(32) int8_t codes[DS4N_MV_ROWS][QK_K];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    const uint8_t *p = w;
    for (int64_t i = 0; i < n / QK_K; i++, p += sizeof(block_q6_K), x += QK_K) {
        for (int r = 0; r < R; r++) {
            const block_q6_K *b = (const block_q6_K *)(p + r * row_stride);
            q6_scales(b, sc[r]);
            q6_bytes(b, codes[r]);
        }
        /* q6_group16's order and arithmetic, on the same code values */
        for (int h = 0; h < 2; h++)
            for (int v = 0; v < 2; v++)
                for (int r = 0; r < R; r++)
                    for (int g = 0; g < 4; g++) {
                        const int o = 128 * h + 32 * g + 16 * v;
                        __m256 s = _mm256_mul_ps(i8x8(load8((const uint8_t *)codes[r] + o)),
                                                 _mm256_loadu_ps(x + o));
                        s = _mm256_fmadd_ps(i8x8(load8((const uint8_t *)codes[r] + o + 8)),
                                            _mm256_loadu_ps(x + o + 8), s);
                        acc[r] = _mm256_fmadd_ps(
                            _mm256_broadcast_ss(&sc[r][2 * (4 * h + g) + v]), s, acc[r]);
                    }
    }
    for (int r = 0; r < R; r++) y[r] = ds4n_hsum_avx2(acc[r]);
}

/* rows_q6's arithmetic for one row and T tokens. */
DS4N_INLINE void cols_q6(const void *w, const float *x, int64_t ldx, const float *xsum,
                         int64_t n, float *y, int64_t ldy, const int T) {
    __m256 acc[DS4N_SMALL_T];
    _Alignas(32) float sc[16];
    for (int t = 0; t < T; t++) acc[t] = _mm256_setzero_ps();
    const block_q6_K *b = w;
    for (int64_t i = 0; i < n / QK_K; i++) {
        q6_scales(&b[i], sc);
        _Alignas(32) int8_t codes[QK_K];
        q6_bytes(&b[i], codes);
        for (int h = 0; h < 2; h++)
            for (int v = 0; v < 2; v++) {
                __m256 ca[4], cb[4];
                for (int g = 0; g < 4; g++) {
                    ca[g] = i8x8(load8((const uint8_t *)codes + 128 * h + 32 * g + 16 * v));
                    cb[g] = i8x8(load8((const uint8_t *)codes + 128 * h + 32 * g + 16 * v + 8));
                }
                for (int t = 0; t < T; t++)
                    acc[t] = q6_group16(acc[t], ca, cb, sc, x + t * ldx + i * QK_K, h, v);
            }
    }
    for (int t = 0; t < T; t++) y[t * ldy] = ds4n_hsum_avx2(acc[t]);
}

DS4N_ROWS_KERNEL(q4_K, rows_k45, 0)
DS4N_ROWS_KERNEL(q5_K, rows_k45, 1)
DS4N_COLS_KERNEL(q4_K, cols_k45, 0)
DS4N_COLS_KERNEL(q5_K, cols_k45, 1)
#define rows_q6_body(unused, ...) rows_q6(__VA_ARGS__)
DS4N_ROWS_KERNEL(q6_K_R, rows_q6_body, 0)
#define cols_q6_body(unused, ...) cols_q6(__VA_ARGS__)
DS4N_COLS_KERNEL(q6_K_T, cols_q6_body, 0)

/* The 4 x 2 tile (two sessions' step, the most common small batch) in a function of its own:
 * inlined among the 31 other tiles of cols_<name>, the same source measured 2-6 % dearer on
 * Zen 3 once the T = 3..8 tiles changed around it (and a loop-alignment pragma did not bring it
 * back); on its own it stays where it was (docs/serving-loop.md, "The small-batch step on
 * AVX2"). */
#define DS4N_F16_LEGACY_ROWS(name, T, block)                                                  \
    DS4N_ROWS_KERNEL(name, rows_f16_legacy, T, sizeof(block))                                 \
    DS4N_TILE_KERNEL(name##_any, tile_f16_legacy, T, sizeof(block))                           \
    static __attribute__((noinline)) void cols42_##name(const void *w, int64_t rs,           \
                                                       const float *x, int64_t ldx,          \
                                                       const float *xs, int64_t n, float *y, \
                                                       int64_t ldy) {                        \
        tile_f16_legacy(T, sizeof(block), w, rs, x, ldx, xs, n, y, ldy, 4, 2);                \
    }                                                                                         \
    static void cols_##name(const void *w, int64_t rs, const float *x, int64_t ldx,          \
                            const float *xs, int64_t n, float *y, int64_t ldy, int R, int T_) { \
        if (R == 4 && T_ == 2)                                                                \
            cols42_##name(w, rs, x, ldx, xs, n, y, ldy);                                      \
        else                                                                                  \
            cols_##name##_any(w, rs, x, ldx, xs, n, y, ldy, R, T_);                           \
    }
DS4N_F16_LEGACY_ROWS(q4_0, DS4N_Q4_0, block_q4_0)
DS4N_F16_LEGACY_ROWS(q4_1, DS4N_Q4_1, block_q4_1)
DS4N_F16_LEGACY_ROWS(q5_0, DS4N_Q5_0, block_q5_0)
DS4N_F16_LEGACY_ROWS(q5_1, DS4N_Q5_1, block_q5_1)
DS4N_F16_LEGACY_ROWS(q8_0, DS4N_Q8_0, block_q8_0)

/* No prefetch by hand on this level: on Zen 3 every decode matvec with rows of at most
 * matmul.c's PREFETCH_ROW_MAX bytes ran 4-22 % faster from memory without it (paired A/B in one
 * process, scripts/figures/matvec_ab.c, 1 thread: Q4_K 1536 x 1536 and 8960 x 1536 1.12 and
 * 1.07, Q4_1 576 x 1536 1.17-1.22, Q8_0 49152 x 576 1.17, Q4_1 1536 x 576 1.04; docs/
 * benchmarks-real-sizes.md, "The Qwen2.5-Coder-1.5B shape on AVX2"), and the integer path's
 * 4-rows-in-step decode kernel then serves the 1.5B's 864-byte Q4_K rows too (1.08-1.09). */
DS4N_DEFINE_KERNEL_SET(ds4n_avx2_set, ds4n_tile_avx2, 0, 1)
