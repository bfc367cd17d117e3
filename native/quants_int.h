/* The integer-activation path (--precision int2/int3): internal to the kernel library.
 *
 * Activations: each 32-value block of a float32 row becomes a power-of-two scale s = 2^e and
 * `limbs` (2 or 3) int8 limbs, successive residuals (Ozaki-style splitting):
 *     l0 = rint(x / s),  l1 = rint((x/s - l0)·2^7),  l2 = rint(((x/s - l0)·2^7 - l1)·2^7)
 * with e the smallest exponent that keeps |l0| <= 127. Every step is exact in float (a power-
 * of-two scaling and the difference of two nearby values), so x = s·(l0 + l1/2^7 + l2/2^14)
 * up to the last limb's rounding: about 15 bits of the block's largest value with two limbs,
 * 22 with three (llama.cpp keeps 8).
 *
 * Weights keep their integer codes (unsigned, with the type's bias: Q8_0's w + 128, the
 * nibbles of Q4_0, Q4_1 and Q4_K, Q6_K's 6-bit value), and the dot products run on integer
 * units.
 *
 * The arithmetic is defined once, here, so that every SIMD level gives bitwise the scalar
 * result, and a token's result does not depend on which other tokens share the call:
 *  - a row is walked in groups of 8 blocks (256 values; Q4_K and Q6_K super-blocks); a group
 *    is 4 pairs of blocks, a pair 16 "lanes" of 4 consecutive values (lane l: block
 *    2i + l/8, values 4·(l%8) .. +3);
 *  - lane value h = 2^7·Σ c·l0 + Σ c·l1 over its 4 values (an exact int32, |h| < 2^24, so
 *    exact as a float); with three limbs f = fma(Σ c·l2, 2^-7, h), else f = h;
 *  - acc[l] = fma(f, ws·xs, acc[l]) with ws the weight scale of the lane's block (Q6_K: of
 *    its 16-group) and xs = 2^(e-7) the activation scale, ws·xs rounded once;
 *  - the bias and Q4_K's min go per block: accm[b] = fma(mb·xs, bsum, accm[b]), mb the
 *    block's bias·scale or min (Q4_1: -m), bsum the block's Σ (l0·2^7 + l1 + l2·2^-7) rounded once
 *    (Q6_K: per 16-group, its two halves in turn);
 *  - y = tree(acc[0..16)) - tree(accm[0..8)), tree adding halves pairwise (i + n/2).
 * A block holding a NaN or infinity gets xs = NaN, so the row's result is NaN, as the float
 * path's would be. */
#ifndef DS4N_QUANTS_INT_H
#define DS4N_QUANTS_INT_H

#include <float.h>
#include <math.h>

#include "quants.h"

#define DS4N_LIMBS_MAX 3
#define DS4N_INT_GROUP 256 /* values per group: 8 blocks of 32 */

/* Quantized activations of T tokens of K values (K a multiple of 32). */
struct ds4n_xq {
    int limbs;
    int64_t K, nb, T;
    int8_t *q;   /* limb k of token t: q + (t*limbs + k)*K, values in order */
    float *xs;   /* [t*nb + b]: 2^(e-7), the unit of the lane values; NaN: not finite */
    float *bsum; /* [t*nb + b]: Σ over the block of l0·2^7 + l1 + l2·2^-7, rounded once */
    float *hsum; /* [t*2nb + 2b + h]: the same over half h (16 values) of the block */
};

/* Bytes ds4n_xq_init needs for T tokens of K values. */
size_t ds4n_xq_bytes(int limbs, int64_t K, int64_t T);
/* Lays the arrays of xq out in buf (ds4n_xq_bytes long, 64-byte aligned). */
void ds4n_xq_init(struct ds4n_xq *xq, void *buf, int limbs, int64_t K, int64_t T);
/* Splits tokens [t0, t1) of X (row stride K) into xq. */
void ds4n_xq_quantize(struct ds4n_xq *xq, const float *X, int64_t t0, int64_t t1);

/* 2^k for a k of the normal range (-126 .. 127). */
static inline float ds4n_pow2f(int k) {
    const uint32_t bits = (uint32_t)(k + 127) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* rint for |v| < 2^22, in the default rounding mode (ties to even), without a libm call. */
static inline float ds4n_round_small(float v) { return (v + 0x1.8p23f) - 0x1.8p23f; }

/* Blocks whose largest magnitude is below this count as zero (their scale would leave the
 * float range a few steps on); no activation of a working model comes near it. */
#define DS4N_INT_TINY 0x1p-100f

static inline void ds4n_int_quantize_block(const float *x, int L, int8_t *q, int64_t K, float *xs, float *bsum,
                           float *hsum) {
    float amax = 0.0f;
    int finite = 1;
    for (int j = 0; j < QK; j++) {
        const float a = fabsf(x[j]);
        finite &= a <= FLT_MAX; /* false for inf and NaN */
        amax = a > amax ? a : amax;
    }
    if (!finite || amax < DS4N_INT_TINY) {
        for (int k = 0; k < L; k++) memset(q + k * K, 0, QK);
        *xs = finite ? 0.0f : NAN;
        *bsum = hsum[0] = hsum[1] = 0.0f;
        return;
    }
    uint32_t bits;
    memcpy(&bits, &amax, 4);
    int e = (int)(bits >> 23) - 133; /* amax / 2^e in [64, 128): amax is normal (>= DS4N_INT_TINY) */
    float inv = ds4n_pow2f(-e);
    if (ds4n_round_small(amax * inv) > 127.0f) e++, inv *= 0.5f;
    int32_t I[DS4N_LIMBS_MAX][2] = {{0, 0}, {0, 0}, {0, 0}};
    for (int j = 0; j < QK; j++) {
        float v = x[j] * inv; /* exact: a power-of-two scaling */
        for (int k = 0; k < L; k++) {
            const float l = ds4n_round_small(v);
            q[k * K + j] = (int8_t)l;
            I[k][j / 16] += (int32_t)l;
            v = (v - l) * 128.0f; /* exact: |v - l| <= 1/2 */
        }
    }
    double h[2];
    for (int i = 0; i < 2; i++) {
        h[i] = (double)(I[0][i] * 128 + I[1][i]) + (L == 3 ? I[2][i] / 128.0 : 0.0);
        hsum[i] = (float)h[i];
    }
    *bsum = (float)(h[0] + h[1]);
    *xs = ds4n_pow2f(e - 7);
}


/* A quantizer over ds4n_int_quantize_block, compiled in each SIMD file with its flags (the
 * steps are exact or correctly rounded, so every build gives the same limbs). */
#define DS4N_INT_DEFINE_QUANTIZE(fname)                                                        \
    void fname(struct ds4n_xq *xq, const float *X, int64_t t0, int64_t t1) {                   \
        const int L = xq->limbs;                                                               \
        for (int64_t t = t0; t < t1; t++)                                                      \
            for (int64_t b = 0; b < xq->nb; b++)                                               \
                ds4n_int_quantize_block(X + t * xq->K + b * QK, L, xq->q + t * L * xq->K + b * QK, \
                                        xq->K, xq->xs + t * xq->nb + b,                        \
                                        xq->bsum + t * xq->nb + b,                             \
                                        xq->hsum + t * 2 * xq->nb + 2 * b);                    \
    }

/* One weight row against tokens [t0, t0 + T) of xq (T in 1..DS4N_SMALL_T): y[t*ldy]. */
typedef void (*ds4n_int_fn)(const void *w, const struct ds4n_xq *xq, int64_t t0, int T, float *y,
                            int64_t ldy);

/* The integer kernel of type for the current SIMD level; NULL when the type has none (the
 * float path then serves it). */
ds4n_int_fn ds4n_active_int_kernel(int type);
void ds4n_int_select(int level); /* called by ds4n_set_simd */

/* The limb count in force on this thread: the pool's (ds4n_pool_set_precision) while it runs
 * a job, 0 (exact float path) elsewhere. */
int ds4n_thread_limbs(void);

/* ---- the reference arithmetic, shared by the scalar kernels and the SIMD kernels' tails ---- */

/* One group of one weight row, unpacked: codes of its n blocks, the weight scale of each lane
 * slot (per block, or per 16-group for Q6_K: per16), and each block's (or 16-group's) mb. */
struct ds4n_int_group {
    int n, per16;
    uint8_t c[DS4N_INT_GROUP];
    float ws[16], mb[16];
};

/* The scales of the group starting at block b0 of a row (blocks [b0, b0 + n), n <= 8). */
static inline void ds4n_int_scales(int type, const uint8_t *row, int64_t b0, int n,
                                   struct ds4n_int_group *g) {
    g->n = n;
    g->per16 = 0;
    switch (type) {
    case DS4N_Q4_1: /* y = d·c + m: the min goes with the block sums, as Q4_K's (negated) */
        for (int b = 0; b < n; b++) {
            const block_q4_1 *p = (const block_q4_1 *)row + b0 + b;
            g->ws[b] = ds4n_f16_to_f32(p->d);
            g->mb[b] = -ds4n_f16_to_f32(p->m);
        }
        break;
    case DS4N_Q8_0:
    case DS4N_Q4_0:
        for (int b = 0; b < n; b++) {
            const uint8_t *p = row + (b0 + b) * (type == DS4N_Q8_0 ? sizeof(block_q8_0)
                                                                  : sizeof(block_q4_0));
            uint16_t d16;
            memcpy(&d16, p, 2); /* d leads both layouts */
            g->ws[b] = ds4n_f16_to_f32(d16);
            g->mb[b] = g->ws[b] * (type == DS4N_Q8_0 ? 128.0f : 8.0f);
        }
        break;
    case DS4N_Q4_K: {
        const block_q4_K *p = (const block_q4_K *)row + b0 / 8;
        const float d = ds4n_f16_to_f32(p->d), dmin = ds4n_f16_to_f32(p->dmin);
        for (int s = 0; s < 8; s++) {
            uint8_t sc, m;
            ds4n_k_scale_min(p->scales, s, &sc, &m);
            g->ws[s] = d * (float)sc;
            g->mb[s] = dmin * (float)m;
        }
        break;
    }
    default: { /* DS4N_Q6_K */
        const block_q6_K *p = (const block_q6_K *)row + b0 / 8;
        const float d = ds4n_f16_to_f32(p->d);
        g->per16 = 1;
        for (int s = 0; s < 16; s++) {
            g->ws[s] = d * (float)p->scales[s];
            g->mb[s] = g->ws[s] * 32.0f;
        }
    }
    }
}

/* The group's scales and codes. */
static inline void ds4n_int_unpack(int type, const uint8_t *row, int64_t b0, int n,
                                   struct ds4n_int_group *g) {
    ds4n_int_scales(type, row, b0, n, g);
    switch (type) {
    case DS4N_Q8_0:
        for (int b = 0; b < n; b++) {
            const block_q8_0 *p = (const block_q8_0 *)row + b0 + b;
            for (int j = 0; j < QK; j++) g->c[32 * b + j] = (uint8_t)(p->qs[j] + 128);
        }
        break;
    case DS4N_Q4_0:
    case DS4N_Q4_1:
        for (int b = 0; b < n; b++) {
            const uint8_t *qs = type == DS4N_Q4_0 ? ((const block_q4_0 *)row + b0 + b)->qs
                                                  : ((const block_q4_1 *)row + b0 + b)->qs;
            for (int j = 0; j < QK / 2; j++) {
                g->c[32 * b + j] = qs[j] & 0x0f;
                g->c[32 * b + j + 16] = qs[j] >> 4;
            }
        }
        break;
    case DS4N_Q4_K: {
        const block_q4_K *p = (const block_q4_K *)row + b0 / 8;
        for (int s = 0; s < 8; s++)
            for (int j = 0; j < 32; j++) {
                const uint8_t q = p->qs[32 * (s / 2) + j];
                g->c[32 * s + j] = s % 2 ? q >> 4 : q & 0x0f;
            }
        break;
    }
    default: { /* DS4N_Q6_K */
        const block_q6_K *p = (const block_q6_K *)row + b0 / 8;
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = p->ql + 64 * h, *qh = p->qh + 32 * h;
            uint8_t *c = g->c + 128 * h;
            for (int l = 0; l < 32; l++) {
                c[l] = (uint8_t)((ql[l] & 0x0f) | ((qh[l] >> 0) & 3) << 4);
                c[l + 32] = (uint8_t)((ql[l + 32] & 0x0f) | ((qh[l] >> 2) & 3) << 4);
                c[l + 64] = (uint8_t)((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4);
                c[l + 96] = (uint8_t)((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4);
            }
        }
    }
    }
}

/* The group g (first block b0) against token t of xq, into acc[16] and accm[8]. */
static inline void ds4n_int_group_ref(const struct ds4n_int_group *g, const struct ds4n_xq *xq,
                                      int64_t t, int64_t b0, float acc[16], float accm[8]) {
    const int L = xq->limbs;
    const int8_t *q = xq->q + t * L * xq->K + b0 * QK;
    const float *xs = xq->xs + t * xq->nb + b0;
    for (int i = 0; i < 4; i++)
        for (int l = 0; l < 16; l++) {
            const int b = 2 * i + l / 8, v0 = 32 * b + 4 * (l % 8);
            if (b >= g->n) continue;
            int32_t s[DS4N_LIMBS_MAX] = {0, 0, 0};
            for (int k = 0; k < L; k++)
                for (int j = v0; j < v0 + 4; j++) s[k] += (int32_t)g->c[j] * q[k * xq->K + j];
            float f = (float)(s[0] * 128 + s[1]);
            if (L == 3) f = fmaf((float)s[2], 0x1p-7f, f);
            const float w = g->ws[g->per16 ? 2 * b + (l % 8) / 4 : b] * xs[b];
            acc[l] = fmaf(f, w, acc[l]);
        }
    for (int b = 0; b < g->n; b++) {
        if (g->per16) {
            const float *hs = xq->hsum + t * 2 * xq->nb + 2 * (b0 + b);
            accm[b] = fmaf(g->mb[2 * b] * xs[b], hs[0], accm[b]);
            accm[b] = fmaf(g->mb[2 * b + 1] * xs[b], hs[1], accm[b]);
        } else {
            accm[b] = fmaf(g->mb[b] * xs[b], xq->bsum[t * xq->nb + b0 + b], accm[b]);
        }
    }
}

/* y = tree(acc[0..16)) - tree(accm[0..8)). */
static inline float ds4n_int_finish(float acc[16], float accm[8]) {
    for (int n = 8; n >= 1; n /= 2)
        for (int i = 0; i < n; i++) acc[i] += acc[i + n];
    for (int n = 4; n >= 1; n /= 2)
        for (int i = 0; i < n; i++) accm[i] += accm[i + n];
    return acc[0] - accm[0];
}

/* Blocks per group and bytes per group of an integer-path type. */
static inline int64_t ds4n_int_group_bytes(int type) {
    switch (type) {
    case DS4N_Q8_0: return 8 * (int64_t)sizeof(block_q8_0);
    case DS4N_Q4_0: return 8 * (int64_t)sizeof(block_q4_0);
    case DS4N_Q4_1: return 8 * (int64_t)sizeof(block_q4_1);
    case DS4N_Q4_K: return sizeof(block_q4_K);
    default: return sizeof(block_q6_K);
    }
}

#if defined(__x86_64__) || defined(_M_X64)
/* The AVX-512 VNNI kernels (NULL entries: none); usable when ds4n_cpu_has_vnni(). */
extern const ds4n_int_fn ds4n_int_avx512[DS4N_TYPE_SLOTS];
void ds4n_xq_quantize_avx512(struct ds4n_xq *xq, const float *X, int64_t t0, int64_t t1);
#endif

#endif
