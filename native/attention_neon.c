/* NEON (AArch64) primitives of the attention kernel; the blocked driver is
 * attention_generic.h. 4-lane vectors: up to 6 query rows against 16-key K tiles (24
 * accumulators of the 32 registers), a vectorized exp, then P·V; f16 and q8_0 KV are
 * widened to floats as they are loaded. Checked against
 * ds4n_attn_scalar under qemu by tests/engine/test_llama_forward.py. */
#include "attention.h"

#include <arm_neon.h>
#include <math.h>
#include <string.h>

#define RG_MAX 6
#define INLINE static inline __attribute__((always_inline))

/* exp(x) to about 1 ulp (Cephes polynomial); exactly 0 for x below -87.3 (and -inf). */
INLINE float32x4_t exp_ps(float32x4_t x) {
    const uint32x4_t keep = vcgeq_f32(x, vdupq_n_f32(-87.3f));
    x = vminq_f32(vmaxq_f32(x, vdupq_n_f32(-87.3f)), vdupq_n_f32(88.3f));
    const float32x4_t fx = vrndnq_f32(vmulq_n_f32(x, 1.44269504088896341f));
    float32x4_t r = vfmsq_f32(x, fx, vdupq_n_f32(0.693359375f));
    r = vfmsq_f32(r, fx, vdupq_n_f32(-2.12194440e-4f));
    float32x4_t p = vdupq_n_f32(1.9875691500e-4f);
    p = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), p, r);
    p = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), p, r);
    p = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.0f)), vmulq_f32(p, r), r);
    const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(fx), vdupq_n_s32(127)), 23);
    const float32x4_t y = vmulq_f32(p, vreinterpretq_f32_s32(e));
    return vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(y), keep));
}

/* Four lanes of halves (at p) widened to floats. */
INLINE float32x4_t f16x4(const uint16_t *p) {
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)));
}

/* Sixteen int8 (at p) widened to four float vectors. */
INLINE void s8x16(const int8_t *p, float32x4_t *out) {
    const int8x16_t q = vld1q_s8(p);
    const int16x8_t lo = vmovl_s8(vget_low_s8(q)), hi = vmovl_high_s8(q);
    out[0] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo)));
    out[1] = vcvtq_f32_s32(vmovl_high_s16(lo));
    out[2] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi)));
    out[3] = vcvtq_f32_s32(vmovl_high_s16(hi));
}

/* S[i][0..16) = Q[i] · K tile, for rg rows; q8_0: each 32-dim block's integer products are
 * summed, then scaled per key lane. */
INLINE void qk_tile(const float *Q, int hd, const void *kt, float *S, int rg, int t) {
    float32x4_t acc[RG_MAX][4];
    for (int i = 0; i < rg; i++)
        for (int c = 0; c < 4; c++) acc[i][c] = vdupq_n_f32(0.0f);
    if (t == DS4N_KV_Q8_0) {
        for (int b = 0; b < hd / DS4N_KV_QK; b++) {
            const char *blk = (const char *)kt + (int64_t)b * DS4N_KT * DS4N_KV_QB;
            const int8_t *qs = (const int8_t *)(blk + 2 * DS4N_KT);
            float32x4_t part[RG_MAX][4];
            for (int i = 0; i < rg; i++)
                for (int c = 0; c < 4; c++) part[i][c] = vdupq_n_f32(0.0f);
            for (int d = 0; d < DS4N_KV_QK; d++) {
                float32x4_t k[4];
                s8x16(qs + d * DS4N_KT, k);
                for (int i = 0; i < rg; i++) {
                    const float32x4_t qb = vdupq_n_f32(Q[i * hd + b * DS4N_KV_QK + d]);
                    for (int c = 0; c < 4; c++) part[i][c] = vfmaq_f32(part[i][c], qb, k[c]);
                }
            }
            for (int c = 0; c < 4; c++) {
                const float32x4_t sc = f16x4((const uint16_t *)blk + 4 * c);
                for (int i = 0; i < rg; i++) acc[i][c] = vfmaq_f32(acc[i][c], part[i][c], sc);
            }
        }
    } else {
        for (int d = 0; d < hd; d++) {
            float32x4_t k[4];
            for (int c = 0; c < 4; c++)
                k[c] = t == DS4N_KV_F16
                           ? f16x4((const uint16_t *)kt + (int64_t)d * DS4N_KT + 4 * c)
                           : vld1q_f32((const float *)kt + (int64_t)d * DS4N_KT + 4 * c);
            for (int i = 0; i < rg; i++) {
                const float32x4_t qb = vdupq_n_f32(Q[i * hd + d]);
                for (int c = 0; c < 4; c++) acc[i][c] = vfmaq_f32(acc[i][c], qb, k[c]);
            }
        }
    }
    for (int i = 0; i < rg; i++)
        for (int c = 0; c < 4; c++) vst1q_f32(S + i * DS4N_KBLOCK + 4 * c, acc[i][c]);
}

/* Values [c0, c0+16) of a V row, widened to floats (c0 is a multiple of 16). */
INLINE void v_lanes(const char *row, int c0, int t, float32x4_t *v) {
    if (t == DS4N_KV_F16) {
        for (int c = 0; c < 4; c++) v[c] = f16x4((const uint16_t *)row + c0 + 4 * c);
    } else if (t == DS4N_KV_Q8_0) {
        const char *blk = row + (int64_t)(c0 / DS4N_KV_QK) * DS4N_KV_QB;
        uint16_t d;
        memcpy(&d, blk, sizeof d);
        const float sc = vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(d))), 0);
        s8x16((const int8_t *)(blk + 2 + c0 % DS4N_KV_QK), v);
        for (int c = 0; c < 4; c++) v[c] = vmulq_n_f32(v[c], sc);
    } else {
        for (int c = 0; c < 4; c++) v[c] = vld1q_f32((const float *)row + c0 + 4 * c);
    }
}

INLINE void pv_tile(const float *P, int nk, const void *V, int hd, float *O,
                    const float *corr, int rg, int t) {
    const int64_t vrow = ds4n_kv_row_bytes(t, hd);
    for (int c0 = 0; c0 < hd; c0 += 16) {
        float32x4_t acc[RG_MAX][4];
        for (int i = 0; i < rg; i++)
            for (int c = 0; c < 4; c++)
                acc[i][c] = vmulq_n_f32(vld1q_f32(O + i * hd + c0 + 4 * c), corr[i]);
        for (int jj = 0; jj < nk; jj++) {
            float32x4_t v[4];
            v_lanes((const char *)V + jj * vrow, c0, t, v);
            for (int i = 0; i < rg; i++) {
                const float32x4_t pb = vdupq_n_f32(P[i * DS4N_KBLOCK + jj]);
                for (int c = 0; c < 4; c++) acc[i][c] = vfmaq_f32(acc[i][c], pb, v[c]);
            }
        }
        for (int i = 0; i < rg; i++)
            for (int c = 0; c < 4; c++) vst1q_f32(O + i * hd + c0 + 4 * c, acc[i][c]);
    }
}

INLINE void softmax_step(float *s, int n, int lo, int lim, float *m, float *l, float *corr) {
    if (lim <= lo) {
        memset(s, 0, sizeof(float) * n);
        *corr = 1.0f;
        return;
    }
    const float32x4_t ninf = vdupq_n_f32(-INFINITY);
    const uint32x4_t lane = {0, 1, 2, 3};
    float32x4_t vmax = ninf;
    for (int c = 0; c < n; c += 4) {
        float32x4_t x = vld1q_f32(s + c);
        if (c + 4 > lim || c < lo) {
            const uint32x4_t idx = vaddq_u32(lane, vdupq_n_u32((uint32_t)c));
            const uint32x4_t in = vandq_u32(vcltq_u32(idx, vdupq_n_u32((uint32_t)lim)),
                                            vcgeq_u32(idx, vdupq_n_u32((uint32_t)lo)));
            x = vbslq_f32(in, x, ninf);
            vst1q_f32(s + c, x);
        }
        vmax = vmaxq_f32(vmax, x);
    }
    const float mx = fmaxf(*m, vmaxvq_f32(vmax));
    *corr = *m == -INFINITY ? 0.0f : expf(*m - mx);
    const float32x4_t vm = vdupq_n_f32(mx);
    float32x4_t vsum = vdupq_n_f32(0.0f);
    for (int c = 0; c < n; c += 4) {
        const float32x4_t p = exp_ps(vsubq_f32(vld1q_f32(s + c), vm));
        vst1q_f32(s + c, p);
        vsum = vaddq_f32(vsum, p);
    }
    *l = *l * *corr + vaddvq_f32(vsum);
    *m = mx;
}

INLINE void scale_row(float *out, const float *o, float inv, int hd) {
    for (int c = 0; c < hd; c += 4) vst1q_f32(out + c, vmulq_n_f32(vld1q_f32(o + c), inv));
}

#include "attention_generic.h"

DS4N_DEFINE_ATTN(ds4n_attn_neon)

void ds4n_swiglu_neon(float *g, const float *u, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t x = vld1q_f32(g + i);
        const float32x4_t y = vdivq_f32(x, vaddq_f32(vdupq_n_f32(1.0f), exp_ps(vnegq_f32(x))));
        vst1q_f32(g + i, vmulq_f32(y, vld1q_f32(u + i)));
    }
    for (; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* (1 + tanh(y)) / 2 = 1 / (1 + exp(-2y)): the tanh GELU as x * sigmoid(2y). */
void ds4n_geglu_neon(float *g, const float *u, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t x = vld1q_f32(g + i);
        const float32x4_t x3 = vmulq_f32(vmulq_f32(x, x), x);
        const float32x4_t inner = vfmaq_f32(x, vdupq_n_f32(0.044715f), x3);
        const float32x4_t e = exp_ps(vmulq_n_f32(inner, -2.0f * 0.7978845608028654f));
        const float32x4_t y = vdivq_f32(x, vaddq_f32(vdupq_n_f32(1.0f), e));
        vst1q_f32(g + i, vmulq_f32(y, vld1q_f32(u + i)));
    }
    if (i < n) ds4n_geglu_scalar(g + i, u + i, n - i);
}
