/* Integer-activation kernels on NEON (aarch64, Advanced SIMD only: every AArch64 CPU has it).
 * The arithmetic is quants_int.h's, lane for lane, so every result is bitwise the scalar
 * kernels'; a float32x4 holds 4 of the 16 float lanes.
 *
 * The block format (Q8_0, Q4_0, Q4_1): quants_int_neon_block.h, here without SDOT; CPUs with
 * it run that header's SDOT build (quants_int_neon_dotprod.c) instead.
 *
 * The super-block format (Q4_K, Q6_K): weights unpacked to int16 code·scale (UMULL of Q4_K's
 * nibble by its 6-bit scale, SMULL of Q6_K's code - 32 by its int8 scale), multiplied by the
 * int16 activations with SMLAL/SMLAL2 into int32: 8 accumulators hold the sums of the 32
 * value positions of a vector (position p of every vector i), and ADDP of adjacent positions
 * gives the 16 lanes (lane l: positions 2l, 2l + 1). Every partial sum is a subset of a lane's
 * terms, within quants_int.h's bound (< 2^31), so the sums are exact and their order free.
 *
 * No prefill tile here: prefill runs the part kernels (matmul.c's sb_tiles). */
#define DS4N_NEON_DOT 0
#include "quants_int_neon_block.h"

/* ---- the super-block format (Q4_K, Q6_K) ----------------------------------------------- */

/* Vector i (values 32i .. 32i + 31) of a super-block as 4 int16x8 code·scale, exactly
 * ds4n_sb_unpack's w. sc: Q4_K's 8 six-bit scales, a byte each (ds4n_k_scale_min8). */
DS4N_INLINE void sb_vec(int type, const uint8_t *blk, uint64_t sc, int i, int16x8_t w[4]) {
    if (type == DS4N_Q4_K) { /* sub-block i: qs 32·(i/2) .., low nibbles for even i */
        const block_q4_K *p = (const block_q4_K *)blk;
        const uint8_t *qs = p->qs + 32 * (i / 2);
        const uint8x16_t s = vdupq_n_u8((uint8_t)(sc >> (8 * i)));
        _Pragma("GCC unroll 2") for (int u = 0; u < 2; u++) {
            const uint8x16_t z = vld1q_u8(qs + 16 * u);
            const uint8x16_t c = i % 2 ? vshrq_n_u8(z, 4) : vandq_u8(z, vdupq_n_u8(0x0f));
            /* nibble·scale <= 15·63: the unsigned product is the int16 */
            w[2 * u] = vreinterpretq_s16_u16(vmull_u8(vget_low_u8(c), vget_low_u8(s)));
            w[2 * u + 1] = vreinterpretq_s16_u16(vmull_high_u8(c, s));
        }
        return;
    }
    /* Q6_K: half h = i/4, r = i%4 (ds4n_sb_unpack's q[r]): the low 4 bits from ql (32 bytes
     * on for odd r, the high nibble for r >= 2), the top 2 from qh >> 2r */
    const block_q6_K *p = (const block_q6_K *)blk;
    const int h = i / 4, r = i % 4;
    const uint8_t *ql = p->ql + 64 * h + 32 * (r % 2), *qh = p->qh + 32 * h;
    _Pragma("GCC unroll 2") for (int u = 0; u < 2; u++) {
        const uint8x16_t l = vld1q_u8(ql + 16 * u), hb = vld1q_u8(qh + 16 * u);
        const uint8x16_t lo = r >= 2 ? vshrq_n_u8(l, 4) : vandq_u8(l, vdupq_n_u8(0x0f));
        uint8x16_t top; /* (qh >> 2r & 3) << 4 */
        switch (r) {
        case 0: top = vshlq_n_u8(hb, 4); break;
        case 1: top = vshlq_n_u8(hb, 2); break;
        case 2: top = hb; break;
        default: top = vshrq_n_u8(hb, 2); break;
        }
        const int8x16_t c = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(lo, vandq_u8(top, vdupq_n_u8(0x30)))),
                                     vdupq_n_s8(32));
        /* 16 values, one int8 scale: 16-group 8h + 2r + u */
        const int8x16_t s = vdupq_n_s8(p->scales[8 * h + 2 * r + u]);
        w[2 * u] = vmull_s8(vget_low_s8(c), vget_low_s8(s));
        w[2 * u + 1] = vmull_high_s8(c, s);
    }
}

/* (The short loops below carry unroll pragmas: clang 14 otherwise keeps some of them rolled,
 * with their vector arrays in memory, 2.3x gcc's instructions per super-block.) */

/* The position sums of one vector: s[2q] += w·a over positions 8q .. 8q + 3, s[2q + 1] over
 * 8q + 4 .. 8q + 7 (a: the vector's 32 activations). */
DS4N_INLINE void sb_mla(const int16x8_t w[4], const int16_t *a, int32x4_t s[8]) {
    _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) {
        const int16x8_t A = vld1q_s16(a + 8 * q);
        s[2 * q] = vmlal_s16(s[2 * q], vget_low_s16(w[q]), vget_low_s16(A));
        s[2 * q + 1] = vmlal_high_s16(s[2 * q + 1], w[q], A);
    }
}

/* The 16 lane sums (lanes 4j .. 4j + 3 in L[j]) from the position sums. */
DS4N_INLINE void sb_lanes(const int32x4_t s[8], int32x4_t L[4]) {
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) L[j] = vpaddq_s32(s[2 * j], s[2 * j + 1]);
}

/* ds4n_f16_to_f32 by FCVT, exact for every half but a NaN (FCVT quiets signalling NaNs):
 * infinities and NaNs take the scalar conversion, which keeps the payload. */
DS4N_INLINE float f16_to_f32(uint16_t h) {
    if ((h & 0x7c00) == 0x7c00) return ds4n_f16_to_f32(h);
    return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
}

/* A super-block's scalars: d, dmin (Q4_K; 0 for Q6_K), Q4_K's 8 mins as int32 (m[0]: 0..3)
 * and its 8 scales (returned, a byte each). */
DS4N_INLINE uint64_t sb_scalars(int type, const uint8_t *blk, float *d, float *dmin,
                                int32x4_t m[2]) {
    if (type == DS4N_Q4_K) {
        const block_q4_K *p = (const block_q4_K *)blk;
        uint64_t sc, mn;
        ds4n_k_scale_min8(p->scales, &sc, &mn);
        *d = f16_to_f32(p->d);
        *dmin = f16_to_f32(p->dmin);
        const uint16x8_t m16 = vmovl_u8(vcreate_u8(mn));
        m[0] = vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(m16)));
        m[1] = vreinterpretq_s32_u32(vmovl_high_u16(m16));
        return sc;
    }
    const block_q6_K *p = (const block_q6_K *)blk;
    *d = f16_to_f32(p->d);
    *dmin = 0.0f;
    m[0] = m[1] = vdupq_n_s32(0);
    return 0;
}

/* ds4n_sb_group_ref's float steps, in its order, from the lane sums L0 (limb 0) and L1
 * (nl = 2), into acc (16 lanes). as: the token's block sums at the group. */
DS4N_INLINE void sb_float(int type, const int32x4_t L0[4], const int32x4_t L1[4], int nl,
                          float d, float dmin, const int32x4_t m[2], float xs, const int32_t *as,
                          int64_t nb, float32x4_t acc[4]) {
    const float D = d * xs;
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
        float32x4_t f = vcvtq_f32_s32(L0[j]);
        if (nl == 2) f = vfmaq_n_f32(f, vcvtq_f32_s32(L1[j]), 0x1p-7f);
        acc[j] = vfmaq_n_f32(acc[j], f, D);
    }
    if (type != DS4N_Q4_K) return;
    const float Dm = dmin * xs;
    _Pragma("GCC unroll 2") for (int j = 0; j < 2; j++) { /* sub-blocks 4j .. 4j + 3 onto lanes 4j .. */
        float32x4_t g = vcvtq_f32_s32(vmulq_s32(m[j], vld1q_s32(as + 4 * j)));
        if (nl == 2) g = vfmaq_n_f32(g, vcvtq_f32_s32(vmulq_s32(m[j], vld1q_s32(as + nb + 4 * j))), 0x1p-7f);
        acc[j] = vfmsq_n_f32(acc[j], g, Dm); /* fma(-g, Dm, acc) */
    }
}

/* One token against super-block blk, its weights unpacked as they are used: a at the group,
 * limb 1 at a + lda. */
DS4N_INLINE void sb_token1(int type, const uint8_t *blk, const int16_t *a, int64_t lda, int nl,
                           float xs, const int32_t *as, int64_t nb, float32x4_t acc[4]) {
    float d, dmin;
    int32x4_t m[2], s0[8], s1[8], L0[4], L1[4];
    const uint64_t sc = sb_scalars(type, blk, &d, &dmin, m);
    _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) s0[j] = s1[j] = vdupq_n_s32(0);
    /* unrolled: each vector's nibble half, scale byte and Q6_K shift are then constants */
    _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) {
        int16x8_t w[4];
        sb_vec(type, blk, sc, i, w);
        sb_mla(w, a + 32 * i, s0);
        if (nl == 2) sb_mla(w, a + lda + 32 * i, s1);
    }
    sb_lanes(s0, L0);
    if (nl == 2) sb_lanes(s1, L1);
    sb_float(type, L0, L1, nl, d, dmin, m, xs, as, nb, acc);
}

/* Groups [g0, g1) of row w against tokens t0 .. t0 + T - 1, into acc[T]. Several tokens
 * share each super-block's unpacked weights (kept in L1, 512 bytes). */
DS4N_INLINE void sb_groups(int type, const uint8_t *w, const struct ds4n_xq *xq, int64_t g0,
                           int64_t g1, int64_t t0, float32x4_t (*acc)[4], const int T) {
    const int nl = xq->limbs - 1;
    const int64_t nb = xq->nb, ng = nb / 8, lda = xq->lda;
    const int64_t bb = type == DS4N_Q4_K ? (int64_t)sizeof(block_q4_K) : (int64_t)sizeof(block_q6_K);
    for (int64_t g = g0; g < g1; g++) {
        const uint8_t *blk = w + g * bb;
        if (T == 1) {
            sb_token1(type, blk, xq->a + t0 * nl * lda + g * DS4N_INT_GROUP, lda, nl,
                      xq->xs[t0 * ng + g], xq->asum + t0 * nl * nb + 8 * g, nb, acc[0]);
            continue;
        }
        float d, dmin;
        int32x4_t m[2];
        const uint64_t sc = sb_scalars(type, blk, &d, &dmin, m);
        int16x8_t W[8][4];
        _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) sb_vec(type, blk, sc, i, W[i]);
        for (int t = 0; t < T; t++) {
            const int64_t tt = t0 + t;
            const int16_t *a = xq->a + tt * nl * lda + g * DS4N_INT_GROUP;
            int32x4_t s0[8], s1[8], L0[4], L1[4];
            _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) s0[j] = s1[j] = vdupq_n_s32(0);
            _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) {
                sb_mla(W[i], a + 32 * i, s0);
                if (nl == 2) sb_mla(W[i], a + lda + 32 * i, s1);
            }
            sb_lanes(s0, L0);
            if (nl == 2) sb_lanes(s1, L1);
            sb_float(type, L0, L1, nl, d, dmin, m, xq->xs[tt * ng + g],
                     xq->asum + tt * nl * nb + 8 * g, nb, acc[t]);
        }
    }
}

DS4N_INLINE void sb_row(int type, const uint8_t *w, const struct ds4n_xq *xq, int64_t t0,
                        float *y, int64_t ldy, const int T) {
    float32x4_t acc[DS4N_SMALL_T][4];
    for (int t = 0; t < T; t++)
        for (int j = 0; j < 4; j++) acc[t][j] = vdupq_n_f32(0.0f);
    sb_groups(type, w, xq, 0, xq->nb / 8, t0, acc, T);
    for (int t = 0; t < T; t++) y[t * ldy] = tree16(acc[t]);
}

/* The prefill step (ds4n_sb_part_fn): the accumulators carried in memory (acc + 16t). */
DS4N_INLINE void sb_part(int type, const uint8_t *w, const struct ds4n_xq *xq, int64_t g0,
                         int64_t g1, int64_t t0, float *accmem, float *y, int64_t ldy,
                         const int T) {
    float32x4_t acc[DS4N_SMALL_T][4];
    for (int t = 0; t < T; t++)
        for (int j = 0; j < 4; j++)
            acc[t][j] = g0 == 0 ? vdupq_n_f32(0.0f) : vld1q_f32(accmem + 16 * t + 4 * j);
    sb_groups(type, w, xq, g0, g1, t0, acc, T);
    for (int t = 0; t < T; t++) {
        if (y) y[t * ldy] = tree16(acc[t]);
        else
            for (int j = 0; j < 4; j++) vst1q_f32(accmem + 16 * t + 4 * j, acc[t][j]);
    }
}

/* Decode (ds4n_int_rows_fn): R rows from R streams, super-block by super-block, so the
 * streams are read in step; each row's steps are sb_groups' for T = 1, in its order. */
DS4N_INLINE void sb_rows1(int type, const uint8_t *w, int64_t stride, const struct ds4n_xq *xq,
                          float *y, const int R) {
    const int nl = xq->limbs - 1;
    const int64_t nb = xq->nb, ng = nb / 8;
    const int64_t bb = type == DS4N_Q4_K ? (int64_t)sizeof(block_q4_K) : (int64_t)sizeof(block_q6_K);
    float32x4_t acc[DS4N_MV_ROWS][4];
    for (int r = 0; r < R; r++)
        for (int j = 0; j < 4; j++) acc[r][j] = vdupq_n_f32(0.0f);
    for (int64_t g = 0; g < ng; g++)
        for (int r = 0; r < R; r++)
            sb_token1(type, w + r * stride + g * bb, xq->a + g * DS4N_INT_GROUP, xq->lda, nl,
                      xq->xs[g], xq->asum + 8 * g, nb, acc[r]);
    for (int r = 0; r < R; r++) y[r] = tree16(acc[r]);
}

DS4N_INT_ROWS_KERNEL(q4_K, DS4N_Q4_K, sb_rows1)
DS4N_INT_ROWS_KERNEL(q6_K, DS4N_Q6_K, sb_rows1)
DS4N_INT_ROW_KERNEL(q4_K, DS4N_Q4_K, sb_row)
DS4N_INT_ROW_KERNEL(q6_K, DS4N_Q6_K, sb_row)
DS4N_INT_PART_KERNEL(q4_K, DS4N_Q4_K, sb_part)
DS4N_INT_PART_KERNEL(q6_K, DS4N_Q6_K, sb_part)

/* ---- the activation quantizer ---------------------------------------------------------- */

/* The largest |x| of n values (a multiple of 4) and whether all are finite. */
DS4N_INLINE float abs_max(const float *x, int n, int *finite) {
    float32x4_t mx = vdupq_n_f32(0.0f);
    uint32x4_t ok = vdupq_n_u32(~0u);
    for (int j = 0; j < n; j += 4) {
        const float32x4_t v = vabsq_f32(vld1q_f32(x + j));
        ok = vandq_u32(ok, vcleq_f32(v, vdupq_n_f32(FLT_MAX))); /* false for inf and NaN */
        mx = vmaxq_f32(mx, v);
    }
    *finite = vminvq_u32(ok) != 0;
    return vmaxvq_f32(mx);
}

/* ds4n_int_quantize_block in vectors: the same exact steps (FRINTN is rint, ties to even). */
static void block_quantize(const float *x, int L, int8_t *q, int64_t K, float *xs, float *bsum) {
    int finite;
    const float amax = abs_max(x, QK, &finite);
    if (!finite || amax < DS4N_INT_TINY) {
        ds4n_int_zero_block(L, q, K, xs, bsum, finite);
        return;
    }
    uint32_t bits;
    memcpy(&bits, &amax, 4);
    int e = (int)(bits >> 23) - 133; /* amax / 2^e in [64, 128) */
    float inv = ds4n_pow2f(-e);
    if (ds4n_round_small(amax * inv) > 127.0f) e++, inv *= 0.5f;
    int32x4_t I[DS4N_LIMBS_MAX] = {vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0)};
    for (int j = 0; j < QK; j += 16) {
        int32x4_t li[DS4N_LIMBS_MAX][4];
        for (int u = 0; u < 4; u++) {
            float32x4_t v = vmulq_n_f32(vld1q_f32(x + j + 4 * u), inv); /* exact */
            for (int k = 0; k < L; k++) {
                const float32x4_t l = vrndnq_f32(v);
                li[k][u] = vcvtq_s32_f32(l);
                I[k] = vaddq_s32(I[k], li[k][u]);
                v = vmulq_n_f32(vsubq_f32(v, l), 128.0f); /* exact: |v - l| <= 1/2 */
            }
        }
        for (int k = 0; k < L; k++) { /* |l| <= 127: the narrowing keeps it */
            const int16x8_t n0 = vcombine_s16(vmovn_s32(li[k][0]), vmovn_s32(li[k][1]));
            const int16x8_t n1 = vcombine_s16(vmovn_s32(li[k][2]), vmovn_s32(li[k][3]));
            vst1q_s8(q + k * K + j, vcombine_s8(vmovn_s16(n0), vmovn_s16(n1)));
        }
    }
    const int32_t I0 = vaddvq_s32(I[0]), I1 = vaddvq_s32(I[1]), I2 = L == 3 ? vaddvq_s32(I[2]) : 0;
    *bsum = (float)((double)(I0 * 128 + I1) + (L == 3 ? I2 / 128.0 : 0.0));
    *xs = ds4n_pow2f(e - 7);
}

/* ds4n_sb_quantize_group in vectors: the same exact steps. */
static void sb_quantize_group(const float *x, int L, int16_t *a, int64_t K, float *xs,
                              int32_t *asum, int64_t nb) {
    int finite;
    const float amax = abs_max(x, DS4N_INT_GROUP, &finite);
    if (!finite || amax < DS4N_INT_TINY) {
        ds4n_sb_zero_group(L, a, K, xs, asum, nb, finite);
        return;
    }
    uint32_t bits;
    memcpy(&bits, &amax, 4);
    const int E = (int)(bits >> 23) - 127;
    const float inv = ds4n_pow2f(14 - E); /* amax·inv in [2^14, 2^15): exact */
    const float32x4_t top = vdupq_n_f32(DS4N_SB_AMAX), bottom = vdupq_n_f32(-DS4N_SB_AMAX);
    for (int b = 0; b < 8; b++) {
        int32x4_t s0 = vdupq_n_s32(0), s1 = vdupq_n_s32(0);
        for (int j = 32 * b; j < 32 * b + 32; j += 8) {
            int32x4_t li[2], l1[2];
            for (int u = 0; u < 2; u++) {
                const float32x4_t v = vmulq_n_f32(vld1q_f32(x + j + 4 * u), inv);
                const float32x4_t l = vminq_f32(vmaxq_f32(vrndnq_f32(v), bottom), top);
                li[u] = vcvtq_s32_f32(l);
                s0 = vaddq_s32(s0, li[u]);
                if (L == 3) { /* exact: |v - l| <= 1 */
                    l1[u] = vcvtq_s32_f32(vrndnq_f32(vmulq_n_f32(vsubq_f32(v, l), 128.0f)));
                    s1 = vaddq_s32(s1, l1[u]);
                }
            }
            vst1q_s16(a + j, vcombine_s16(vmovn_s32(li[0]), vmovn_s32(li[1])));
            if (L == 3) vst1q_s16(a + K + j, vcombine_s16(vmovn_s32(l1[0]), vmovn_s32(l1[1])));
        }
        asum[b] = vaddvq_s32(s0);
        if (L == 3) asum[nb + b] = vaddvq_s32(s1);
    }
    *xs = ds4n_pow2f(E - 14);
}

/* The byte planes (xq->ab) stay unwritten on this level: only the x86 kernels read them. */
static inline void no_planes(const int16_t *a, uint8_t *lo, int8_t *hi, int16_t *pc) {
    (void)a, (void)lo, (void)hi, (void)pc;
}

static DS4N_INT_DEFINE_QUANTIZE(xq_quantize, block_quantize, sb_quantize_group, no_planes)

/* ---- the set ---------------------------------------------------------------------------- */

DS4N_INT_DEFINE_SET(ds4n_int_neon, NULL, NULL); /* prefill on the part kernels */
