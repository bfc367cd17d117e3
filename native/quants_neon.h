/* Inline helpers shared by the NEON kernel files (aarch64 only). */
#ifndef DS4N_QUANTS_NEON_H
#define DS4N_QUANTS_NEON_H

#include <arm_neon.h>

#include "quants_simd.h"

void ds4n_tile_neon(const float *W, int64_t ldw, const float *X, int64_t ldx, int64_t k,
                    float *Y, int64_t ldy, int R, int C, int accumulate);

#endif
