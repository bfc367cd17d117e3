/* The AVX-512 peaks (compiled with the AVX-512 flags and -mavx512vnni; the VNNI probes run
 * only where the integer kernels of quants_int_avx512.c run, the FMA probe on any AVX-512
 * CPU). Each step is one 512-bit instruction, the one the prefill kernels issue:
 * the f32 tile's VFMADD231PS (matmul_avx512.c, 16 multiply-adds), the super-block format's
 * VPDPWSSD (int16 × int16, 32) and the block format's VPDPBUSD (uint8 × int8, 64). */
#include <immintrin.h>

#include "macpeak.h"

#define PEAK_REG(x) "v"(x)
#include "macpeak_generic.h"

static inline __m512 fma_step(__m512 a) {
    return _mm512_fmadd_ps(_mm512_set1_ps(1.0f), _mm512_set1_ps(1e-9f), a);
}
static inline __m512i dpwssd_step(__m512i a) {
    return _mm512_dpwssd_epi32(a, _mm512_set1_epi16(3), _mm512_set1_epi16(5));
}
static inline __m512i dpbusd_step(__m512i a) {
    return _mm512_dpbusd_epi32(a, _mm512_set1_epi8(3), _mm512_set1_epi8(5));
}

DS4N_PEAK_DEFINE(ds4n_peak_avx512_fma, __m512, _mm512_setzero_ps(), fma_step, 16)
DS4N_PEAK_DEFINE(ds4n_peak_avx512_dpwssd, __m512i, _mm512_setzero_si512(), dpwssd_step, 32)
DS4N_PEAK_DEFINE(ds4n_peak_avx512_dpbusd, __m512i, _mm512_setzero_si512(), dpbusd_step, 64)
