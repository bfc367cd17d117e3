/* NEON row kernels (aarch64). Dequantizers are bit-identical to the scalar ones (separate
 * multiply and add, as there); dots are fused with d·Σq·x + m·Σx for affine blocks. Types
 * without a NEON dequantizer here use the scalar one with the NEON float dot. */
#include "quants_neon.h"

static inline float f16(uint16_t h) { return ds4n_f16_to_f32(h); }

/* ---- float types ---------------------------------------------------------------------- */

DS4N_INLINE float32x4_t load_float4(int type, const void *p, int64_t i) {
    switch (type) {
    case DS4N_F16:
        return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)p + i)));
    case DS4N_BF16:
        return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16((const uint16_t *)p + i), 16));
    default:
        return vld1q_f32((const float *)p + i);
    }
}

DS4N_INLINE void dequant_float(int type, const void *src, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, load_float4(type, src, i));
    for (; i < n; i++) y[i] = load_float1(type, src, i);
}

DS4N_INLINE float dot_float(int type, const void *w, const float *x, int64_t n) {
    float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = vfmaq_f32(acc0, load_float4(type, w, i), vld1q_f32(x + i));
        acc1 = vfmaq_f32(acc1, load_float4(type, w, i + 4), vld1q_f32(x + i + 4));
        acc2 = vfmaq_f32(acc2, load_float4(type, w, i + 8), vld1q_f32(x + i + 8));
        acc3 = vfmaq_f32(acc3, load_float4(type, w, i + 12), vld1q_f32(x + i + 12));
    }
    for (; i + 4 <= n; i += 4) acc0 = vfmaq_f32(acc0, load_float4(type, w, i), vld1q_f32(x + i));
    float s = vaddvq_f32(vaddq_f32(vaddq_f32(acc0, acc1), vaddq_f32(acc2, acc3)));
    for (; i < n; i++) s += load_float1(type, w, i) * x[i];
    return s;
}

/* ---- legacy 32-value blocks ------------------------------------------------------------ */

struct legacy_block {
    float d, m;
    float32x4_t q[8]; /* the 32 codes, offset removed */
};

/* 16 bits -> 16 bytes, 0x10 where the bit is set (the 5th bit of Q5 codes). */
static inline uint8x16_t fifth_bits(uint32_t bits) {
    static const uint8_t mask_bytes[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    uint8x16_t v = vcombine_u8(vdup_n_u8((uint8_t)bits), vdup_n_u8((uint8_t)(bits >> 8)));
    return vandq_u8(vtstq_u8(v, vld1q_u8(mask_bytes)), vdupq_n_u8(0x10));
}

static inline void widen(int8x16_t v, float32x4_t *q) {
    int16x8_t lo = vmovl_s8(vget_low_s8(v)), hi = vmovl_s8(vget_high_s8(v));
    q[0] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo)));
    q[1] = vcvtq_f32_s32(vmovl_s16(vget_high_s16(lo)));
    q[2] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi)));
    q[3] = vcvtq_f32_s32(vmovl_s16(vget_high_s16(hi)));
}

DS4N_INLINE void unpack_nibbles(const uint8_t *qs, const uint8_t *qh, int offset,
                                float32x4_t q[8]) {
    uint8x16_t bytes = vld1q_u8(qs);
    uint8x16_t lo = vandq_u8(bytes, vdupq_n_u8(0x0f)), hi = vshrq_n_u8(bytes, 4);
    if (qh) {
        uint32_t h;
        memcpy(&h, qh, 4);
        lo = vorrq_u8(lo, fifth_bits(h & 0xffff));
        hi = vorrq_u8(hi, fifth_bits(h >> 16));
    }
    int8x16_t off = vdupq_n_s8((int8_t)offset);
    widen(vsubq_s8(vreinterpretq_s8_u8(lo), off), q);
    widen(vsubq_s8(vreinterpretq_s8_u8(hi), off), q + 4);
}

static inline void unpack_q8(const int8_t *qs, float32x4_t q[8]) {
    widen(vld1q_s8(qs), q);
    widen(vld1q_s8(qs + 16), q + 4);
}

DS4N_DEFINE_LOAD_LEGACY


DS4N_INLINE void dequant_legacy(int type, int64_t block_bytes, const void *src, float *y,
                                int64_t n) {
    const uint8_t *p = src;
    struct legacy_block b;
    for (int64_t i = 0; i < n / QK; i++, p += block_bytes, y += QK) {
        load_legacy(type, p, &b);
        float32x4_t d = vdupq_n_f32(b.d), m = vdupq_n_f32(b.m);
        for (int k = 0; k < 8; k++) {
            float32x4_t v = vmulq_f32(d, b.q[k]);
            vst1q_f32(y + 4 * k, is_affine(type) ? vaddq_f32(v, m) : v);
        }
    }
}

DS4N_INLINE float dot_legacy(int type, int64_t block_bytes, const void *w, const float *x,
                             int64_t n) {
    const uint8_t *p = w;
    float32x4_t acc = vdupq_n_f32(0.0f), accm = acc;
    struct legacy_block b;
    for (int64_t i = 0; i < n / QK; i++, p += block_bytes, x += QK) {
        load_legacy(type, p, &b);
        float32x4_t qx0 = vmulq_f32(b.q[0], vld1q_f32(x)), qx1 = vmulq_f32(b.q[1], vld1q_f32(x + 4));
        float32x4_t xs = vaddq_f32(vld1q_f32(x), vld1q_f32(x + 4));
        for (int k = 2; k < 8; k += 2) {
            float32x4_t x0 = vld1q_f32(x + 4 * k), x1 = vld1q_f32(x + 4 * k + 4);
            qx0 = vfmaq_f32(qx0, b.q[k], x0);
            qx1 = vfmaq_f32(qx1, b.q[k + 1], x1);
            if (is_affine(type)) xs = vaddq_f32(xs, vaddq_f32(x0, x1));
        }
        acc = vfmaq_n_f32(acc, vaddq_f32(qx0, qx1), b.d);
        if (is_affine(type)) accm = vfmaq_n_f32(accm, xs, b.m);
    }
    return vaddvq_f32(vaddq_f32(acc, accm));
}

/* ---- the NEON kernel set --------------------------------------------------------------- */

DS4N_DEFINE_FLOAT_AND_LEGACY_KERNELS

DS4N_DOT_VIA_SCALAR_DEQUANT(dot_q2_K, DS4N_Q2_K, dot_f32)
DS4N_DOT_VIA_SCALAR_DEQUANT(dot_q3_K, DS4N_Q3_K, dot_f32)
DS4N_DOT_VIA_SCALAR_DEQUANT(dot_q4_K, DS4N_Q4_K, dot_f32)
DS4N_DOT_VIA_SCALAR_DEQUANT(dot_q5_K, DS4N_Q5_K, dot_f32)
DS4N_DOT_VIA_SCALAR_DEQUANT(dot_q6_K, DS4N_Q6_K, dot_f32)
DS4N_DOT_VIA_SCALAR_DEQUANT(dot_iq2_xxs, DS4N_IQ2_XXS, dot_f32)

const struct ds4n_kernel_set ds4n_neon_set = {
    .row = {
        DS4N_DOT(F32, f32), DS4N_ROW(F16, f16), DS4N_ROW(BF16, bf16),
        DS4N_ROW(Q4_0, q4_0), DS4N_ROW(Q4_1, q4_1), DS4N_ROW(Q5_0, q5_0),
        DS4N_ROW(Q5_1, q5_1), DS4N_ROW(Q8_0, q8_0),
        DS4N_DOT(Q2_K, q2_K), DS4N_DOT(Q3_K, q3_K), DS4N_DOT(Q4_K, q4_K),
        DS4N_DOT(Q5_K, q5_K), DS4N_DOT(Q6_K, q6_K),
        DS4N_DOT(IQ2_XXS, iq2_xxs),
    },
    .dot_f32 = dot_f32,
    .tile = ds4n_tile_neon,
};
