/* NEON GEMM micro-kernel: R weight rows x C tokens of 4-wide accumulators, dot form (see
 * matmul_avx2.c; aarch64 has 32 vector registers, so the 4 x 3 tile never spills). */
#include "quants_neon.h"

DS4N_INLINE void tile_rc(const float *W, int64_t ldw, const float *X, int64_t ldx, int64_t k,
                         float *Y, int64_t ldy, const int R, const int C, int accumulate) {
    float32x4_t acc[DS4N_TILE_ROWS][DS4N_TILE_COLS];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < C; t++) acc[r][t] = vdupq_n_f32(0.0f);
    int64_t i = 0;
    for (; i + 4 <= k; i += 4) {
        float32x4_t x[DS4N_TILE_COLS];
        for (int t = 0; t < C; t++) x[t] = vld1q_f32(X + t * ldx + i);
        for (int r = 0; r < R; r++) {
            float32x4_t w = vld1q_f32(W + r * ldw + i);
            for (int t = 0; t < C; t++) acc[r][t] = vfmaq_f32(acc[r][t], w, x[t]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < C; t++) {
            float s = vaddvq_f32(acc[r][t]);
            for (int64_t j = i; j < k; j++) s += W[r * ldw + j] * X[t * ldx + j];
            Y[t * ldy + r] = accumulate ? Y[t * ldy + r] + s : s;
        }
}

DS4N_DEFINE_TILE(ds4n_tile_neon)
