/* Inline helpers shared by the AVX2 kernel files (only included where -mavx2 -mfma -mf16c). */
#ifndef DS4N_QUANTS_AVX2_H
#define DS4N_QUANTS_AVX2_H

#include <immintrin.h>

#include "quants_simd.h"

static inline float ds4n_hsum_avx2(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The four horizontal sums {Σa, Σb, Σc, Σd} in one vector. */
static inline __m128 ds4n_hsum4_avx2(__m256 a, __m256 b, __m256 c, __m256 d) {
    __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d);
    __m256 abcd = _mm256_hadd_ps(ab, cd);
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

void ds4n_tile_avx2(const float *W, int64_t ldw, const float *X, int64_t ldx, int64_t k,
                    float *Y, int64_t ldy, int R, int C, int accumulate);

#endif
