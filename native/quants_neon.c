/* NEON row kernels (aarch64): the vector primitives and code unpackers quants_generic.h
 * builds every type's kernels from. */
#include "quants_neon.h"
#include "iq2xxs_tables.h"
#include "nibble_tables.h"

static inline float f16(uint16_t h) { return ds4n_f16_to_f32(h); }

/* ---- primitives ------------------------------------------------------------------------ */

typedef float32x4_t vacc;
typedef struct {
    float32x4_t v[4];
} v16;

static inline vacc vzero(void) { return vdupq_n_f32(0.0f); }
static inline vacc vadd(vacc a, vacc b) { return vaddq_f32(a, b); }
static inline vacc vsub(vacc a, vacc b) { return vsubq_f32(a, b); }
static inline float vhsum(vacc a) { return vaddvq_f32(a); }
static inline vacc vfma_s(vacc acc, float s, vacc v) { return vfmaq_n_f32(acc, v, s); }

static inline vacc vfma_m(vacc acc, const float *s, vacc v) { return vfma_s(acc, *s, v); }

static inline vacc v16_dot(v16 q, const float *x) {
    float32x4_t a = vmulq_f32(q.v[0], vld1q_f32(x)), b = vmulq_f32(q.v[1], vld1q_f32(x + 4));
    a = vfmaq_f32(a, q.v[2], vld1q_f32(x + 8));
    b = vfmaq_f32(b, q.v[3], vld1q_f32(x + 12));
    return vaddq_f32(a, b);
}

/* acc + q·x, lane-wise (no horizontal sum). */
static inline vacc v16_fma(vacc acc, v16 q, const float *x) {
    for (int k = 0; k < 4; k++) acc = vfmaq_f32(acc, q.v[k], vld1q_f32(x + 4 * k));
    return acc;
}

static inline vacc v16_sum(const float *x) {
    return vaddq_f32(vaddq_f32(vld1q_f32(x), vld1q_f32(x + 4)),
                     vaddq_f32(vld1q_f32(x + 8), vld1q_f32(x + 12)));
}

static inline void v16_store(float *y, v16 q, float d) {
    for (int k = 0; k < 4; k++) vst1q_f32(y + 4 * k, vmulq_n_f32(q.v[k], d));
}

static inline void v16_store_affine(float *y, v16 q, float d, float m) {
    for (int k = 0; k < 4; k++)
        vst1q_f32(y + 4 * k, vaddq_f32(vmulq_n_f32(q.v[k], d), vdupq_n_f32(m)));
}

/* ---- float rows ------------------------------------------------------------------------ */

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

/* ---- code unpackers -------------------------------------------------------------------- */

/* 16 signed bytes as floats. */
static inline v16 widen16(int8x16_t b) {
    int16x8_t lo = vmovl_s8(vget_low_s8(b)), hi = vmovl_s8(vget_high_s8(b));
    v16 q = {{vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))), vcvtq_f32_s32(vmovl_high_s16(lo)),
              vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))), vcvtq_f32_s32(vmovl_high_s16(hi))}};
    return q;
}

static inline v16 widen16u(uint8x16_t b) { return widen16(vreinterpretq_s8_u8(b)); }

/* Byte-wise right shift by a run-time count. */
static inline uint8x16_t shr(uint8x16_t v, int count) {
    return vshlq_u8(v, vdupq_n_s8((int8_t)-count));
}

/* 16 bits -> 16 bytes, 0x10 where the bit is set (the 5th bit of Q5 codes). */
static inline uint8x16_t fifth_bits(uint32_t bits) {
    static const uint8_t mask_bytes[16] = {1, 2, 4, 8, 16, 32, 64, 128,
                                           1, 2, 4, 8, 16, 32, 64, 128};
    uint8x16_t v = vcombine_u8(vdup_n_u8((uint8_t)bits), vdup_n_u8((uint8_t)(bits >> 8)));
    return vandq_u8(vtstq_u8(v, vld1q_u8(mask_bytes)), vdupq_n_u8(0x10));
}

/* out[2r], out[2r+1] = the two halves at p + r*stride as floats, r < R. */
DS4N_INLINE void f16_pairs(const uint8_t *p, int64_t stride, const int R, float *out) {
    for (int r = 0; r < R; r++) {
        uint16_t h[2];
        memcpy(h, p + r * stride, 4);
        out[2 * r] = f16(h[0]), out[2 * r + 1] = f16(h[1]);
    }
}

DS4N_INLINE void legacy_codes(const uint8_t *qs, const uint8_t *qh, int offset, v16 q[2]) {
    uint8x16_t bytes = vld1q_u8(qs);
    uint8x16_t lo = vandq_u8(bytes, vdupq_n_u8(0x0f)), hi = vshrq_n_u8(bytes, 4);
    if (qh) {
        uint32_t h;
        memcpy(&h, qh, 4);
        lo = vorrq_u8(lo, fifth_bits(h & 0xffff));
        hi = vorrq_u8(hi, fifth_bits(h >> 16));
    }
    q[0] = widen16u(vsubq_u8(lo, vdupq_n_u8((uint8_t)offset)));
    q[1] = widen16u(vsubq_u8(hi, vdupq_n_u8((uint8_t)offset)));
}

static inline void q8_codes(const int8_t *qs, v16 q[2]) {
    q[0] = widen16(vld1q_s8(qs));
    q[1] = widen16(vld1q_s8(qs + 16));
}

DS4N_INLINE void k45_codes(const uint8_t *qs, const uint8_t *qh, int s, v16 q[2]) {
    for (int c = 0; c < 2; c++) {
        uint8x16_t v = shr(vld1q_u8(qs + s / 2 * 32 + 16 * c), 4 * (s % 2));
        v = vandq_u8(v, vdupq_n_u8(0x0f));
        if (qh) {
            uint8x16_t h = vandq_u8(shr(vld1q_u8(qh + 16 * c), s), vdupq_n_u8(1));
            v = vorrq_u8(v, vshlq_n_u8(h, 4));
        }
        q[c] = widen16u(v);
    }
}

DS4N_INLINE void q6_codes(const block_q6_K *b, int h, int r, v16 q[2]) {
    for (int c = 0; c < 2; c++) {
        uint8x16_t lo = shr(vld1q_u8(b->ql + h * 64 + (r % 2) * 32 + 16 * c), 4 * (r / 2));
        uint8x16_t hi = shr(vld1q_u8(b->qh + h * 32 + 16 * c), 2 * r);
        lo = vandq_u8(lo, vdupq_n_u8(0x0f));
        hi = vandq_u8(hi, vdupq_n_u8(3));
        q[c] = widen16u(vsubq_u8(vorrq_u8(lo, vshlq_n_u8(hi, 4)), vdupq_n_u8(32)));
    }
}

/* Q3_K: a clear high bit (bit 4h + j of hmask) subtracts 4, i.e. code = (lo | hbit << 2) - 4. */
DS4N_INLINE void k23_codes(const uint8_t *qs, const uint8_t *hmask, int h, int j, v16 q[2]) {
    for (int c = 0; c < 2; c++) {
        uint8x16_t v = vandq_u8(shr(vld1q_u8(qs + 32 * h + 16 * c), 2 * j), vdupq_n_u8(3));
        if (hmask) {
            uint8x16_t hb = vandq_u8(shr(vld1q_u8(hmask + 16 * c), 4 * h + j), vdupq_n_u8(1));
            v = vsubq_u8(vorrq_u8(v, vshlq_n_u8(hb, 2)), vdupq_n_u8(4));
        }
        q[c] = widen16u(v);
    }
}

/* Lattice point l (byte l of idx) with sign pattern l (7 bits of meta), as 8 signed bytes;
 * the magnitudes are below 64, so negation stays in range. */
static inline int8x8_t iq2_point(uint32_t idx, uint32_t meta, int l) {
    static const uint8_t bits[8] = {1, 2, 4, 8, 16, 32, 64, 128};
    int8x8_t grid = vreinterpret_s8_u8(vld1_u8(ds4n_iq2xxs_grid[(idx >> (8 * l)) & 0xff]));
    uint8x8_t neg = vtst_u8(vdup_n_u8(ds4n_iq2xxs_ksigns[(meta >> (7 * l)) & 127]), vld1_u8(bits));
    return vbsl_s8(neg, vneg_s8(grid), grid);
}

static inline void iq2_codes(uint32_t idx, uint32_t meta, v16 q[2]) {
    q[0] = widen16(vcombine_s8(iq2_point(idx, meta, 0), iq2_point(idx, meta, 1)));
    q[1] = widen16(vcombine_s8(iq2_point(idx, meta, 2), iq2_point(idx, meta, 3)));
}

/* A 16-entry byte table indexed by each nibble: one tbl per 16 codes. */
static inline void nibble_codes(const uint8_t *qs, const int8_t *table, v16 q[2]) {
    uint8x16_t bytes = vld1q_u8(qs);
    int8x16_t values = vld1q_s8(table);
    q[0] = widen16(vqtbl1q_s8(values, vandq_u8(bytes, vdupq_n_u8(0x0f))));
    q[1] = widen16(vqtbl1q_s8(values, vshrq_n_u8(bytes, 4)));
}

#include "quants_generic.h"

DS4N_DEFINE_KERNEL_SET(ds4n_neon_set, ds4n_tile_neon, 0, 0)
