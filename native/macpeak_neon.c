/* The NEON peaks. Each step is what the level's kernels issue per 128-bit vector of
 * products: the f32 tile's FMLA (matmul_neon.c, 4 multiply-adds); the integer super-block
 * format's SMLAL (quants_int_neon.c: int16 × int16 into int32, 4); the block format's SMULL
 * and a pairwise add into the int32 sum (quants_int_neon_block.h without SDOT: int8 × int8,
 * 8). The SDOT probe is in macpeak_neon_dotprod.c (its own flags). SMULL has no accumulating
 * form, so the accumulator is the multiply's operand there: the chain runs through it. */
#include <arm_neon.h>

#include "macpeak.h"

#define PEAK_REG(x) "w"(x)
#include "macpeak_generic.h"

static inline float32x4_t fma_step(float32x4_t a) {
    return vfmaq_f32(a, vdupq_n_f32(1.0f), vdupq_n_f32(1e-9f));
}
static inline int32x4_t smlal_step(int32x4_t a) {
    return vmlal_s16(a, vget_low_s16(vreinterpretq_s16_s32(a)), vdup_n_s16(3));
}
static inline int32x4_t smull_step(int32x4_t a) {
    return vpadalq_s16(a, vmull_s8(vget_low_s8(vreinterpretq_s8_s32(a)), vdup_n_s8(3)));
}

DS4N_PEAK_DEFINE(ds4n_peak_neon_fma, float32x4_t, vdupq_n_f32(0.0f), fma_step, 4)
DS4N_PEAK_DEFINE(ds4n_peak_neon_smlal, int32x4_t, vdupq_n_s32(0), smlal_step, 4)
DS4N_PEAK_DEFINE(ds4n_peak_neon_smull, int32x4_t, vdupq_n_s32(0), smull_step, 8)
