/* The NEON peak: the f32 tile's FMLA (matmul_neon.c, 4 multiply-adds per 128-bit vector).
 * The integer path has no NEON kernels (the level runs the scalar ones), so no integer
 * probe here: see macpeak.c. */
#include <arm_neon.h>

#include "macpeak.h"

#define PEAK_REG(x) "w"(x)
#include "macpeak_generic.h"

static inline float32x4_t fma_step(float32x4_t a) {
    return vfmaq_f32(a, vdupq_n_f32(1.0f), vdupq_n_f32(1e-9f));
}

DS4N_PEAK_DEFINE(ds4n_peak_neon_fma, float32x4_t, vdupq_n_f32(0.0f), fma_step, 4)
