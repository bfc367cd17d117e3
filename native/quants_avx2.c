/* AVX2+FMA+F16C row kernels (compiled with those flags, chosen at run time). */
#include "quants_avx2.h"

static float dot_f32(const void *w, const float *x, int64_t n) {
    const float *a = w;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(x + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(x + i + 8), acc1);
    }
    for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(x + i), acc0);
    float s = ds4n_hsum_avx2(_mm256_add_ps(acc0, acc1));
    for (; i < n; i++) s += a[i] * x[i];
    return s;
}

const struct ds4n_kernel_set ds4n_avx2_set = {
    .row = {
        [DS4N_F32] = {NULL, dot_f32},
    },
    .dot_f32 = dot_f32,
    .tile = ds4n_tile_avx2,
};
