/* AVX-512 GEMM micro-kernel (compiled with the AVX-512 flags, chosen at run time).
 *
 * Dot form, as matmul_avx2.c: R weight rows x C tokens of 16-wide accumulators (up to 4 x 6 =
 * 24 of the 32 zmm registers), each step loads 16 floats of every row and token and issues
 * R*C FMAs; the horizontal sums are taken once per panel. Six tokens, not AVX2's three: a
 * 16-float step reads twice the bytes of the weight panel, which lives in L2, and twice the
 * FMAs per weight load keep that read within L2's bandwidth. */
#include <immintrin.h>

#include "quants.h"
#include "quants_avx512.h"

DS4N_INLINE void tile_rc(const float *W, int64_t ldw, const float *X, int64_t ldx, int64_t k,
                         float *Y, int64_t ldy, const int R, const int C, int accumulate) {
    __m512 acc[DS4N_TILE_ROWS][DS4N_TILE_COLS_MAX];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < C; t++) acc[r][t] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
        __m512 x[DS4N_TILE_COLS_MAX];
        for (int t = 0; t < C; t++) x[t] = _mm512_loadu_ps(X + t * ldx + i);
        for (int r = 0; r < R; r++) {
            __m512 w = _mm512_loadu_ps(W + r * ldw + i);
            for (int t = 0; t < C; t++) acc[r][t] = _mm512_fmadd_ps(w, x[t], acc[r][t]);
        }
    }
    for (int t = 0; t < C; t++) {
        __m512 z = _mm512_setzero_ps();
        float s[4];
        _mm_storeu_ps(s, ds4n_hsum4_avx512(acc[0][t], R > 1 ? acc[1][t] : z,
                                           R > 2 ? acc[2][t] : z, R > 3 ? acc[3][t] : z));
        for (int r = 0; r < R; r++) {
            for (int64_t j = i; j < k; j++) s[r] += W[r * ldw + j] * X[t * ldx + j];
            Y[t * ldy + r] = accumulate ? Y[t * ldy + r] + s[r] : s[r];
        }
    }
}

DS4N_DEFINE_TILE6(ds4n_tile_avx512)
