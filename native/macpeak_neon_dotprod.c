/* The SDOT peak (compiled with -march=armv8.2-a+dotprod, like quants_int_neon_dotprod.c, and
 * called only where those kernels were chosen: the CPU has SDOT). One step is one SDOT:
 * 16 int8 × int8 multiply-adds into four int32 lanes, the block format's lane sum. */
#include <arm_neon.h>

#include "macpeak.h"

#define PEAK_REG(x) "w"(x)
#include "macpeak_generic.h"

static inline int32x4_t sdot_step(int32x4_t a) {
    return vdotq_s32(a, vdupq_n_s8(3), vdupq_n_s8(5));
}

DS4N_PEAK_DEFINE(ds4n_peak_neon_sdot, int32x4_t, vdupq_n_s32(0), sdot_step, 16)
