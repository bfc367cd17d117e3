/* AVX-512 row kernels (F, BW, VL, DQ with FMA and F16C; compiled with those flags, chosen at
 * run time): the vector primitives and code unpackers quants_generic.h builds every type's
 * kernels from. A v16 is one 16-float register, so a 32-value block is two.
 *
 * With 512-bit operations only two vector ports execute (p0 and p5 on Intel cores), and the
 * byte-to-lane widenings and permutes all need p5; the unpackers below keep that port's share
 * low: bytes go to 32-bit lanes straight from memory (one p5 op per 16 codes), nibbles are
 * split with AND and shift (either port), the Q5 fifth bits and IQ2 signs are applied under
 * mask registers, and 4-bit lookup tables are one lane permute per 16 codes. */
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

DS4N_INLINE void legacy_codes(const uint8_t *qs, const uint8_t *qh, int offset, v16 q[2]) {
    const __m512i b = u8x16(qs), m4 = _mm512_set1_epi32(0x0f);
    __m512i lo = _mm512_and_si512(b, m4), hi = _mm512_srli_epi32(b, 4);
    if (qh) { /* bit j of qh is the fifth bit of code j */
        uint32_t h;
        memcpy(&h, qh, 4);
        const __m512i b4 = _mm512_set1_epi32(0x10);
        lo = _mm512_mask_or_epi32(lo, (__mmask16)(h & 0xffff), lo, b4);
        hi = _mm512_mask_or_epi32(hi, (__mmask16)(h >> 16), hi, b4);
    }
    if (offset) {
        const __m512i off = _mm512_set1_epi32(offset);
        lo = _mm512_sub_epi32(lo, off), hi = _mm512_sub_epi32(hi, off);
    }
    q[0] = _mm512_cvtepi32_ps(lo);
    q[1] = _mm512_cvtepi32_ps(hi);
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

#include "quants_generic.h"

DS4N_DEFINE_KERNEL_SET(ds4n_avx512_set, ds4n_tile_avx512, DS4N_TILE_COLS_MAX)
