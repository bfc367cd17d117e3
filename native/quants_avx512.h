/* Inline helpers shared by the AVX-512 kernel files (only included where the AVX-512 flags of
 * native/Makefile are on: F, BW, VL, DQ with FMA and F16C). */
#ifndef DS4N_QUANTS_AVX512_H
#define DS4N_QUANTS_AVX512_H

#include <immintrin.h>

#include "quants_simd.h"

/* Σ of the 16 lanes: halves added pairwise (8 + 8, 4 + 4, ...), a fixed order. */
static inline float ds4n_hsum_avx512(__m512 v) {
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The four horizontal sums {Σa, Σb, Σc, Σd} in one vector. */
static inline __m128 ds4n_hsum4_avx512(__m512 a, __m512 b, __m512 c, __m512 d) {
    /* 16 -> 8 lanes each, then the AVX2 pattern on the 8-lane halves. */
    __m256 a8 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
    __m256 b8 = _mm256_add_ps(_mm512_castps512_ps256(b), _mm512_extractf32x8_ps(b, 1));
    __m256 c8 = _mm256_add_ps(_mm512_castps512_ps256(c), _mm512_extractf32x8_ps(c, 1));
    __m256 d8 = _mm256_add_ps(_mm512_castps512_ps256(d), _mm512_extractf32x8_ps(d, 1));
    __m256 ab = _mm256_hadd_ps(a8, b8), cd = _mm256_hadd_ps(c8, d8);
    __m256 abcd = _mm256_hadd_ps(ab, cd);
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

void ds4n_tile_avx512(const float *W, int64_t ldw, const float *X, int64_t ldx, int64_t k,
                      float *Y, int64_t ldy, int R, int C, int accumulate);

#endif
