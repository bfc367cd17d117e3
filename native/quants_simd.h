/* Helpers every SIMD kernel file (quants_*.c, matmul_*.c) shares. The row kernels
 * themselves are written once in quants_generic.h. */
#ifndef DS4N_QUANTS_SIMD_H
#define DS4N_QUANTS_SIMD_H

#include "quants.h"

#define DS4N_INLINE static inline __attribute__((always_inline))

/* Value i of a float-type row, for the tails shorter than a vector. */
DS4N_INLINE float load_float1(int type, const void *p, int64_t i) {
    switch (type) {
    case DS4N_F16: return ds4n_f16_to_f32(((const uint16_t *)p)[i]);
    case DS4N_BF16: return ds4n_bf16_to_f32(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

/* The ds4n_tile_fn `fname` over tile_rc(W, ldw, X, ldx, k, Y, ldy, R, C, accumulate) inlined
 * with constant R and C, so every edge tile keeps its accumulators in registers: C up to 3
 * (DS4N_DEFINE_TILE) or up to 6 (DS4N_DEFINE_TILE6, for sets with 32 vector registers). */
#define DS4N_TILE_CASE(R, C)                                                       \
    case R * 8 + C:                                                                \
        tile_rc(W, ldw, X, ldx, k, Y, ldy, R, C, accumulate);                      \
        break;
#define DS4N_TILE_CASES3(R) DS4N_TILE_CASE(R, 1) DS4N_TILE_CASE(R, 2) DS4N_TILE_CASE(R, 3)
#define DS4N_TILE_CASES6(R) \
    DS4N_TILE_CASES3(R) DS4N_TILE_CASE(R, 4) DS4N_TILE_CASE(R, 5) DS4N_TILE_CASE(R, 6)
#define DS4N_DEFINE_TILE_N(fname, CASES)                                                    \
    void fname(const float *W, int64_t ldw, const float *X, int64_t ldx, int64_t k, float *Y, \
               int64_t ldy, int R, int C, int accumulate) {                                 \
        switch (R * 8 + C) {                                                                \
            CASES(1) CASES(2) CASES(3) CASES(4)                                             \
        }                                                                                   \
    }
#define DS4N_DEFINE_TILE(fname) DS4N_DEFINE_TILE_N(fname, DS4N_TILE_CASES3)
#define DS4N_DEFINE_TILE6(fname) DS4N_DEFINE_TILE_N(fname, DS4N_TILE_CASES6)
_Static_assert(DS4N_TILE_ROWS == 4 && DS4N_TILE_COLS == 3 && DS4N_TILE_COLS_MAX == 6,
               "DS4N_DEFINE_TILE covers 4 x 3, DS4N_DEFINE_TILE6 4 x 6");

#endif
