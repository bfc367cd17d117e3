/* The AVX2 peaks (compiled with -mavx2 -mfma). Each step is what the level's prefill kernels
 * issue per 256-bit vector of products: the f32 tile's VFMADD231PS (matmul_avx2.c, 8
 * multiply-adds); the super-block format's VPMADDWD into an int32 sum (quants_int_avx2.c's
 * tile_half: int16 × int16, 16); the block format's VPMADDUBSW, VPMADDWD by a constant and
 * the int32 add (block_lanes, per limb: uint8 × int8, 32). AVX2 has no accumulating form, so
 * the accumulator is the multiply's second operand: the chain runs through the products. */
#include <immintrin.h>

#include "macpeak.h"

#define PEAK_REG(x) "v"(x)
#include "macpeak_generic.h"

static inline __m256 fma_step(__m256 a) {
    return _mm256_fmadd_ps(_mm256_set1_ps(1.0f), _mm256_set1_ps(1e-9f), a);
}
static inline __m256i madd_step(__m256i a) {
    return _mm256_add_epi32(a, _mm256_madd_epi16(_mm256_set1_epi16(3), a));
}
static inline __m256i maddubs_step(__m256i a) {
    const __m256i p = _mm256_maddubs_epi16(_mm256_set1_epi8(3), a);
    return _mm256_add_epi32(a, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}

DS4N_PEAK_DEFINE(ds4n_peak_avx2_fma, __m256, _mm256_setzero_ps(), fma_step, 8)
DS4N_PEAK_DEFINE(ds4n_peak_avx2_madd, __m256i, _mm256_setzero_si256(), madd_step, 16)
DS4N_PEAK_DEFINE(ds4n_peak_avx2_maddubs, __m256i, _mm256_setzero_si256(), maddubs_step, 32)
