/* The NEON kernels of the integer path's block format (Q8_0, Q4_0, Q4_1), written once and
 * compiled twice (aarch64 only): in quants_int_neon.c for every AArch64 CPU (DS4N_NEON_DOT 0)
 * and in quants_int_neon_dotprod.c with -march=armv8.2-a+dotprod (DS4N_NEON_DOT 1), chosen at
 * run time when the CPU has SDOT. The arithmetic is quants_int.h's, lane for lane: a lane is
 * 4 consecutive values of one block, so one block's 32 values give its 8 lanes in order.
 *  - DS4N_NEON_DOT 1: SDOT (4 signed byte products summed into each int32 lane) is the lane
 *    sum itself. Codes and limbs are both read signed: Q4_0's and Q4_1's nibbles (0..15) are;
 *    Q8_0's biased code w + 128 (0..255) is not, so its sum is Σ w·l + 128·Σ l, the second
 *    part two more SDOTs against 64 (127 is the largest signed byte).
 *  - DS4N_NEON_DOT 0: SMULL (signed bytes into int16 products: |c·l| <= 128·127 with Q8_0's
 *    w, 15·127 with the nibbles), Q8_0's + 128·l by SMLSL against -128 (the int16 result
 *    (w + 128)·l is at most 255·127 = 32385: exact), SADDLP (pairs into int32) and ADDP (the
 *    pairs' pairs: the 4-value lanes).
 * Every sum is an exact integer, so the order of the integer additions is free; the float
 * steps (conversion, the limb FMA, acc = fma(f, ws·xs, acc), the bias FMA, the tree) run in
 * the reference's order. */
#ifndef DS4N_QUANTS_INT_NEON_BLOCK_H
#define DS4N_QUANTS_INT_NEON_BLOCK_H

#ifndef DS4N_NEON_DOT
#error "define DS4N_NEON_DOT (0 or 1) before including quants_int_neon_block.h"
#endif

#include <arm_neon.h>

#include "quants_int.h"
#include "quants_simd.h"

/* ds4n_f16_to_f32 of n (<= 8) halves h[0], h[stride / 2], ... (zero past n): FCVTL, exact
 * for every half but a NaN (it quiets signalling NaNs); a group holding an infinity or a NaN
 * takes the scalar conversion, which keeps the payload. */
DS4N_INLINE void f16x8(const uint8_t *h, int64_t stride, int n, float32x4_t v[2]) {
    uint16_t b[8] = {0};
    for (int i = 0; i < n; i++) memcpy(&b[i], h + i * stride, 2);
    const uint16x8_t u = vld1q_u16(b);
    const uint16x8_t e = vandq_u16(u, vdupq_n_u16(0x7c00));
    if (vmaxvq_u16(vceqq_u16(e, vdupq_n_u16(0x7c00)))) {
        float f[8];
        for (int i = 0; i < 8; i++) f[i] = ds4n_f16_to_f32(b[i]);
        v[0] = vld1q_f32(f), v[1] = vld1q_f32(f + 4);
        return;
    }
    v[0] = vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(u)));
    v[1] = vcvt_high_f32_f16(vreinterpretq_f16_u16(u));
}

/* ws and mb of a group of n blocks at grp, as ds4n_int_scales computes them (the same
 * products, rounded once each); zero past n. */
DS4N_INLINE void group_scales(int type, const uint8_t *grp, int n, float32x4_t ws[2],
                              float32x4_t mb[2]) {
    const int64_t bb = type == DS4N_Q8_0   ? (int64_t)sizeof(block_q8_0)
                       : type == DS4N_Q4_0 ? (int64_t)sizeof(block_q4_0)
                                           : (int64_t)sizeof(block_q4_1);
    f16x8(grp, bb, n, ws); /* d leads every layout */
    if (type == DS4N_Q4_1) { /* -m */
        f16x8(grp + 2, bb, n, mb);
        mb[0] = vnegq_f32(mb[0]), mb[1] = vnegq_f32(mb[1]);
        return;
    }
    const float k = type == DS4N_Q8_0 ? 128.0f : 8.0f;
    mb[0] = vmulq_n_f32(ws[0], k), mb[1] = vmulq_n_f32(ws[1], k);
}

/* acc + f·s[lane] (one rounding), lane a constant once inlined. */
DS4N_INLINE float32x4_t fma_lane(float32x4_t acc, float32x4_t f, float32x4_t s, int lane) {
    switch (lane & 3) {
    case 0: return vfmaq_laneq_f32(acc, f, s, 0);
    case 1: return vfmaq_laneq_f32(acc, f, s, 1);
    case 2: return vfmaq_laneq_f32(acc, f, s, 2);
    default: return vfmaq_laneq_f32(acc, f, s, 3);
    }
}

/* The codes of block b of the group at grp, 32 values in order as signed bytes: Q8_0's w
 * (not biased), the nibbles of Q4_0 and Q4_1. */
DS4N_INLINE void block_codes(int type, const uint8_t *grp, int b, int8x16_t c[2]) {
    if (type == DS4N_Q8_0) {
        const int8_t *qs = ((const block_q8_0 *)grp + b)->qs;
        c[0] = vld1q_s8(qs), c[1] = vld1q_s8(qs + 16);
        return;
    }
    const uint8_t *qs = type == DS4N_Q4_0 ? ((const block_q4_0 *)grp + b)->qs
                                          : ((const block_q4_1 *)grp + b)->qs;
    const uint8x16_t v = vld1q_u8(qs);
    /* low nibbles: values 0..15, high nibbles: values 16..31 */
    c[0] = vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0f)));
    c[1] = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));
}

/* acc + the 4 lane sums of 16 values: Σ c·l over each lane's 4 values (Q8_0: c = w + 128). */
DS4N_INLINE int32x4_t lanes16(int type, int32x4_t acc, int8x16_t c, int8x16_t l) {
#if DS4N_NEON_DOT
    acc = vdotq_s32(acc, c, l);
    if (type == DS4N_Q8_0) {
        const int8x16_t k64 = vdupq_n_s8(64);
        acc = vdotq_s32(vdotq_s32(acc, k64, l), k64, l);
    }
    return acc;
#else
    int16x8_t p0 = vmull_s8(vget_low_s8(c), vget_low_s8(l)), p1 = vmull_high_s8(c, l);
    if (type == DS4N_Q8_0) { /* + 128·l: the int16 (w + 128)·l, exact */
        p0 = vmlsl_s8(p0, vget_low_s8(l), vdup_n_s8(-128));
        p1 = vmlsl_high_s8(p1, l, vdupq_n_s8(-128));
    }
    return vaddq_s32(acc, vpaddq_s32(vpaddlq_s16(p0), vpaddlq_s16(p1)));
#endif
}

/* h = 2^7·Σ c·l0 + Σ c·l1 of block (codes c) against limbs q (stride K), lanes 0..3 in h[0],
 * 4..7 in h[1]; with three limbs Σ c·l2 in s2. */
DS4N_INLINE void block_lanes(int type, const int8x16_t c[2], const int8_t *q, int64_t K, int L,
                             int32x4_t h[2], int32x4_t s2[2]) {
    const int32x4_t z = vdupq_n_s32(0);
    _Pragma("GCC unroll 2") for (int i = 0; i < 2; i++) {
        const int32x4_t s0 = lanes16(type, z, c[i], vld1q_s8(q + 16 * i));
        /* 2^7·s0 + Σ c·l1, accumulated onto the shifted limb-0 sums (exact) */
        h[i] = lanes16(type, vshlq_n_s32(s0, 7), c[i], vld1q_s8(q + K + 16 * i));
        if (L == 3) s2[i] = lanes16(type, z, c[i], vld1q_s8(q + 2 * K + 16 * i));
    }
}

/* ds4n_int_finish's tree over 16 lanes (a[0] lanes 0..3 .. a[3] lanes 12..15): i + 8, then
 * halves pairwise. */
DS4N_INLINE float tree16(const float32x4_t a[4]) {
    const float32x4_t s = vaddq_f32(vaddq_f32(a[0], a[2]), vaddq_f32(a[1], a[3]));
    const float32x2_t p = vadd_f32(vget_low_f32(s), vget_high_f32(s));
    return vget_lane_f32(p, 0) + vget_lane_f32(p, 1);
}

/* The same over 8 lanes. */
DS4N_INLINE float tree8(const float32x4_t m[2]) {
    const float32x4_t s = vaddq_f32(m[0], m[1]);
    const float32x2_t p = vadd_f32(vget_low_f32(s), vget_high_f32(s));
    return vget_lane_f32(p, 0) + vget_lane_f32(p, 1);
}

/* n (<= 8) floats of p, zero past n (not read). */
DS4N_INLINE void load8(const float *p, int n, float32x4_t v[2]) {
    if (n == 8) {
        v[0] = vld1q_f32(p), v[1] = vld1q_f32(p + 4);
        return;
    }
    float b[8] = {0};
    for (int i = 0; i < n; i++) b[i] = p[i];
    v[0] = vld1q_f32(b), v[1] = vld1q_f32(b + 4);
}

/* Group gi (n blocks at grp) of one row against tokens t0 .. t0 + T - 1, into acc[t] (16
 * lanes) and accm[t] (8 blocks). One token unpacks each block's codes where it uses them;
 * more unpack them once for all. Called with a constant n for the full groups. */
DS4N_INLINE void int_group(int type, const uint8_t *grp, const int n, const struct ds4n_xq *xq,
                           int64_t gi, int64_t t0, const int T, float32x4_t (*acc)[4],
                           float32x4_t (*accm)[2]) {
    const int L = xq->limbs;
    const int64_t K = xq->K, nb = xq->nb;
    float32x4_t ws[2], mb[2];
    group_scales(type, grp, n, ws, mb);
    int8x16_t cc[8][2];
    if (T > 1)
        for (int b = 0; b < n; b++) block_codes(type, grp, b, cc[b]);
    for (int t = 0; t < T; t++) {
        const int64_t tt = t0 + t;
        const int8_t *q = xq->q + tt * L * K + gi * DS4N_INT_GROUP;
        float32x4_t x8[2], bs[2];
        load8(xq->xs + tt * nb + gi * 8, n, x8);
        load8(xq->bsum + tt * nb + gi * 8, n, bs);
        /* ws·xs per block, rounded once */
        const float32x4_t S[2] = {vmulq_f32(ws[0], x8[0]), vmulq_f32(ws[1], x8[1])};
        _Pragma("GCC unroll 8") for (int b = 0; b < n; b++) {
            int8x16_t own[2];
            if (T == 1) block_codes(type, grp, b, own);
            int32x4_t h[2], s2[2];
            block_lanes(type, T == 1 ? own : cc[b], q + 32 * b, K, L, h, s2);
            _Pragma("GCC unroll 2") for (int i = 0; i < 2; i++) {
                float32x4_t f = vcvtq_f32_s32(h[i]);
                if (L == 3) f = vfmaq_n_f32(f, vcvtq_f32_s32(s2[i]), 0x1p-7f);
                acc[t][2 * (b % 2) + i] = fma_lane(acc[t][2 * (b % 2) + i], f, S[b / 4], b % 4);
            }
        }
        /* the bias, per block: mb·xs rounded once, then the FMA with bsum; past n, mb and
         * bsum are zero and fma(0, 0, acc) keeps acc (never -0: it starts at +0) */
        _Pragma("GCC unroll 2") for (int i = 0; i < 2; i++)
            accm[t][i] = vfmaq_f32(accm[t][i], vmulq_f32(mb[i], x8[i]), bs[i]);
    }
}

/* A row's accumulators before its first group. */
DS4N_INLINE void zero_acc(float32x4_t acc[4], float32x4_t accm[2]) {
    for (int i = 0; i < 4; i++) acc[i] = vdupq_n_f32(0.0f);
    accm[0] = accm[1] = vdupq_n_f32(0.0f);
}

DS4N_INLINE void int_row(int type, const uint8_t *w, const struct ds4n_xq *xq, int64_t t0,
                         float *y, int64_t ldy, const int T) {
    const int64_t nb = xq->nb, gb = ds4n_int_group_bytes(type);
    float32x4_t acc[DS4N_SMALL_T][4], accm[DS4N_SMALL_T][2];
    for (int t = 0; t < T; t++) zero_acc(acc[t], accm[t]);
    for (int64_t gi = 0; gi * 8 < nb; gi++) {
        /* n < 8 only in the last group of a row */
        const int n = nb - gi * 8 < 8 ? (int)(nb - gi * 8) : 8;
        if (n == 8) int_group(type, w + gi * gb, 8, xq, gi, t0, T, acc, accm);
        else int_group(type, w + gi * gb, n, xq, gi, t0, T, acc, accm);
    }
    for (int t = 0; t < T; t++) y[t * ldy] = tree16(acc[t]) - tree8(accm[t]);
}

/* Decode (ds4n_int_rows_fn): R rows from R streams, group by group, so the streams are read
 * in step; each row's steps are int_row's for T = 1, in its order. */
DS4N_INLINE void int_rows1(int type, const uint8_t *w, int64_t stride, const struct ds4n_xq *xq,
                           float *y, const int R) {
    const int64_t nb = xq->nb, gb = ds4n_int_group_bytes(type);
    float32x4_t acc[DS4N_MV_ROWS][4], accm[DS4N_MV_ROWS][2];
    for (int r = 0; r < R; r++) zero_acc(acc[r], accm[r]);
    for (int64_t gi = 0; gi * 8 < nb; gi++) {
        const int n = nb - gi * 8 < 8 ? (int)(nb - gi * 8) : 8;
        for (int r = 0; r < R; r++) {
            const uint8_t *grp = w + r * stride + gi * gb;
            if (n == 8) int_group(type, grp, 8, xq, gi, 0, 1, &acc[r], &accm[r]);
            else int_group(type, grp, n, xq, gi, 0, 1, &acc[r], &accm[r]);
        }
    }
    for (int r = 0; r < R; r++) y[r] = tree16(acc[r]) - tree8(accm[r]);
}

/* The block-format kernels of a set: int_q8_0 .. (ds4n_int_fn, T = 1..8) and rows_q8_0 ..
 * (ds4n_int_rows_fn, R = 1..4), static in the including file. */
DS4N_INT_ROW_KERNEL(q8_0, DS4N_Q8_0, int_row)
DS4N_INT_ROW_KERNEL(q4_0, DS4N_Q4_0, int_row)
DS4N_INT_ROW_KERNEL(q4_1, DS4N_Q4_1, int_row)
DS4N_INT_ROWS_KERNEL(q8_0, DS4N_Q8_0, int_rows1)
DS4N_INT_ROWS_KERNEL(q4_0, DS4N_Q4_0, int_rows1)
DS4N_INT_ROWS_KERNEL(q4_1, DS4N_Q4_1, int_rows1)

#endif
