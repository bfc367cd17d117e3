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
 * That is the block format, used by the 32-value block types (Q4_0, Q4_1, Q8_0). The
 * K-quants (Q4_K, Q6_K) use the super-block format defined further down: one scale per 256
 * values and the two limbs in one int16.
 *
 * Weights keep their integer codes (unsigned, with the type's bias: Q8_0's w + 128, the
 * nibbles of Q4_0 and Q4_1), and the dot products run on integer units.
 *
 * The arithmetic is defined once, here, so that every SIMD level gives bitwise the scalar
 * result, and a token's result does not depend on which other tokens share the call:
 *  - a row is walked in groups of 8 blocks (256 values); a group
 *    is 4 pairs of blocks, a pair 16 "lanes" of 4 consecutive values (lane l: block
 *    2i + l/8, values 4·(l%8) .. +3);
 *  - lane value h = 2^7·Σ c·l0 + Σ c·l1 over its 4 values (an exact int32, |h| < 2^24, so
 *    exact as a float); with three limbs f = fma(Σ c·l2, 2^-7, h), else f = h;
 *  - acc[l] = fma(f, ws·xs, acc[l]) with ws the weight scale of the lane's block and
 *    xs = 2^(e-7) the activation scale, ws·xs rounded once;
 *  - the bias goes per block: accm[b] = fma(mb·xs, bsum, accm[b]), mb the block's
 *    bias·scale (Q4_1: -m), bsum the block's Σ (l0·2^7 + l1 + l2·2^-7) rounded once;
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

/* Quantized activations of T tokens of K values (K a multiple of 32; of 256 with sb). Two
 * formats: the block format above (sb = 0: Q4_0, Q4_1, Q8_0) and the super-block format of
 * the K-quants (sb = 1: Q4_K, Q6_K), described before ds4n_sb_quantize_group below. */
struct ds4n_xq {
    int limbs, sb;
    int64_t K, nb, T;
    /* sb = 0 */
    int8_t *q;   /* limb k of token t: q + (t*limbs + k)*K, values in order */
    float *xs;   /* [t*nb + b]: 2^(e-7), the unit of the lane values; NaN: not finite.
                  * sb = 1: [t*ng + g], 2^e, the unit of a, per group g of 256 values */
    float *bsum; /* [t*nb + b]: Σ over the block of l0·2^7 + l1 + l2·2^-7, rounded once */
    /* sb = 1 */
    int16_t *a;    /* limb k (k < limbs - 1) of token t: a + (t*(limbs-1) + k)*lda */
    int64_t lda;   /* K + DS4N_SB_PAD: rows 4 KB apart would share L1 sets */
    int32_t *asum; /* [((t*(limbs-1) + k)*nb + b]: Σ of limb k over block b (32 values) */
    /* sb = 1: each limb of a again, byte-split for VPMADDUBSW (ds4n_sb_split_group below):
     * limb k of token t at ab + (t*(limbs-1) + k)*4*lda, the low bytes (lda of them), the
     * high bytes (lda), then the pair sums (lda int16). Derived from a, never the reverse.
     * NULL when T > DS4N_SMALL_T (prefill's chunks: their kernels take a). */
    uint8_t *ab;
};

/* Bytes ds4n_xq_init needs for up to T tokens of K values (any count up to T fits). */
size_t ds4n_xq_bytes(int limbs, int sb, int64_t K, int64_t T);
/* Lays the arrays of xq out in buf (ds4n_xq_bytes long, 64-byte aligned). */
void ds4n_xq_init(struct ds4n_xq *xq, void *buf, int limbs, int sb, int64_t K, int64_t T);
/* Splits tokens [t0, t1) of X (row stride K) into xq, in xq's format. */
void ds4n_xq_quantize(struct ds4n_xq *xq, const float *X, int64_t t0, int64_t t1);
#define DS4N_SB_PAD 32 /* int16 values between super-block format rows */
#define DS4N_SB_AMAX 32767.0f /* the largest |a0| of the super-block format */
/* 1 when type's integer kernel takes the super-block format. */
static inline int ds4n_int_type_sb(int type) { return type == DS4N_Q4_K || type == DS4N_Q6_K; }

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

/* A block whose values are not all finite, or all below DS4N_INT_TINY: zero limbs and sum,
 * xs NaN (the row's result is NaN, as the float path's) or 0. Every level's quantizer. */
static inline void ds4n_int_zero_block(int L, int8_t *q, int64_t K, float *xs, float *bsum,
                                       int finite) {
    for (int k = 0; k < L; k++) memset(q + k * K, 0, QK);
    *xs = finite ? 0.0f : NAN;
    *bsum = 0.0f;
}

static inline void ds4n_int_quantize_block(const float *x, int L, int8_t *q, int64_t K,
                                           float *xs, float *bsum) {
    float amax = 0.0f;
    int finite = 1;
    for (int j = 0; j < QK; j++) {
        const float a = fabsf(x[j]);
        finite &= a <= FLT_MAX; /* false for inf and NaN */
        amax = a > amax ? a : amax;
    }
    if (!finite || amax < DS4N_INT_TINY) {
        ds4n_int_zero_block(L, q, K, xs, bsum, finite);
        return;
    }
    uint32_t bits;
    memcpy(&bits, &amax, 4);
    int e = (int)(bits >> 23) - 133; /* amax / 2^e in [64, 128): amax is normal (>= DS4N_INT_TINY) */
    float inv = ds4n_pow2f(-e);
    if (ds4n_round_small(amax * inv) > 127.0f) e++, inv *= 0.5f;
    int32_t I[DS4N_LIMBS_MAX] = {0, 0, 0};
    for (int j = 0; j < QK; j++) {
        float v = x[j] * inv; /* exact: a power-of-two scaling */
        for (int k = 0; k < L; k++) {
            const float l = ds4n_round_small(v);
            q[k * K + j] = (int8_t)l;
            I[k] += (int32_t)l;
            v = (v - l) * 128.0f; /* exact: |v - l| <= 1/2 */
        }
    }
    *bsum = (float)((double)(I[0] * 128 + I[1]) + (L == 3 ? I[2] / 128.0 : 0.0));
    *xs = ds4n_pow2f(e - 7);
}


/* ---- the super-block format (Q4_K, Q6_K) -------------------------------------------------
 * The K-quants keep integer sub-block scales under one float scale per 256 values, so their
 * activations get one power-of-two scale per 256 values too, and everything inside a
 * super-block stays integer (llama.cpp's Q4_K x Q8_K design, with wider activations):
 *  - a0 = rint(x / s) clamped to ±(2^15 - 1), s = 2^e with amax / s in [2^14, 2^15) (amax:
 *    the group's largest |x|): the whole int16 (int2, ~16 bits of the group's largest value;
 *    the clamp moves only values within one unit of the top). With three limbs
 *    a1 = rint((x/s - a0)·2^7), |a1| <= 128 (int3, ~23 bits). The bits are relative to the
 *    largest of 256 values, not of 32: a group holding an outlier quantizes its other values
 *    more coarsely (measured in docs/integer-path.md); the 16th bit pays for part of that.
 *  - weights w = code·scale as int16: Q4_K the nibble (0..15) times the 6-bit sub-block scale,
 *    |w| <= 945; Q6_K (q - 32) in -32..31 times the int8 16-group scale, |w| <= 4096;
 *  - a group is 8 vectors of 32 values; lane l (0..15) sums values 32i + 2l and 32i + 2l + 1
 *    over i < 8 in int32: A_k[l] = Σ w·a_k over 16 values. Bounds: Q4_K 16·945·32767 < 2^29,
 *    Q6_K 16·4096·32767 = 2^31 - 65536 (the clamp keeps it below 2^31; limb 1 is 2^8 times
 *    smaller), so no order of the integer additions can overflow, every order gives the same A;
 *  - f = (float)A_0[l]; with three limbs f = fmaf((float)A_1[l], 2^-7, f);
 *    acc[l] = fmaf(f, d·s, acc[l]), d the super-block's f16 scale, d·s rounded once;
 *  - Q4_K's mins, for sub-block j < 8: M_k = m_j·asum_k[j] (|M| <= 63·32·32767 < 2^26),
 *    g = (float)M_0 (three limbs: fmaf((float)M_1, 2^-7, g)), acc[j] = fmaf(-g, dmin·s, acc[j]);
 *  - y = tree(acc[0..16)) as ds4n_int_finish's.
 * Per 256 values and token: 8 integer dot-product instructions against one conversion and
 * one FMA (two with Q4_K's mins); the block format needs four of each. */

/* The super-block format's ds4n_int_zero_block: a group not all finite, or all below
 * DS4N_INT_TINY, gets zero limbs and block sums, xs NaN or 0. Every level's quantizer. */
static inline void ds4n_sb_zero_group(int L, int16_t *a, int64_t K, float *xs, int32_t *asum,
                                      int64_t nb, int finite) {
    for (int k = 0; k < L - 1; k++) {
        memset(a + k * K, 0, DS4N_INT_GROUP * sizeof *a);
        memset(asum + k * nb, 0, 8 * sizeof *asum);
    }
    *xs = finite ? 0.0f : NAN;
}

/* Group g (256 values at x) of a token: limb k at a + k·K (K: the row stride, xq->lda), its
 * block sums at asum + k·nb. */
static inline void ds4n_sb_quantize_group(const float *x, int L, int16_t *a, int64_t K,
                                          float *xs, int32_t *asum, int64_t nb) {
    float amax = 0.0f;
    int finite = 1;
    for (int j = 0; j < DS4N_INT_GROUP; j++) {
        const float v = fabsf(x[j]);
        finite &= v <= FLT_MAX;
        amax = v > amax ? v : amax;
    }
    if (!finite || amax < DS4N_INT_TINY) {
        ds4n_sb_zero_group(L, a, K, xs, asum, nb, finite);
        return;
    }
    uint32_t bits;
    memcpy(&bits, &amax, 4);
    const int E = (int)(bits >> 23) - 127; /* amax in [2^E, 2^(E+1)), E in -100 .. 127 */
    const float inv = ds4n_pow2f(14 - E);  /* amax·inv in [2^14, 2^15): exact */
    for (int b = 0; b < 8; b++) {
        int32_t S[2] = {0, 0};
        for (int j = 32 * b; j < 32 * b + 32; j++) {
            const float v = x[j] * inv;
            const float l = fminf(fmaxf(ds4n_round_small(v), -DS4N_SB_AMAX), DS4N_SB_AMAX);
            a[j] = (int16_t)l;
            S[0] += (int32_t)l;
            if (L == 3) {
                const float l1 = ds4n_round_small((v - l) * 128.0f); /* exact: |v - l| <= 1 */
                a[K + j] = (int16_t)l1;
                S[1] += (int32_t)l1;
            }
        }
        for (int k = 0; k < L - 1; k++) asum[k * nb + b] = S[k];
    }
    *xs = ds4n_pow2f(E - 14);
}

/* The byte split of one group of one limb (256 int16 values at a): a = 256·h + l exactly,
 * l = the low byte read unsigned (0..255), h = (a - l) / 256 (-128..127 for any int16: the
 * high byte read signed). Two signed bytes would not do: 256·h + l then spans
 * [-32896, 32639], and the clamp lets a reach 32767. So VPMADDUBSW takes l as its unsigned
 * operand against the codes, and the codes as its unsigned operand against h.
 * pc holds, per vector of 32 values and its 16 value pairs m (values 2m, 2m + 1), 32·(l pair
 * sum) and 32·(h pair sum) interleaved, pairs in the order 0..3, 8..11, 4..7, 12..15 (the
 * order AVX2's in-lane unpack of two 16-lane vectors gives): Q6_K's bias, 32·Σ a over a pair,
 * split the same way (Σ (q - 32)·a = Σ q·a - 32·Σ a). */
static inline void ds4n_sb_split_group(const int16_t *a, uint8_t *lo, int8_t *hi, int16_t *pc) {
    static const int order[16] = {0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15};
    for (int j = 0; j < DS4N_INT_GROUP; j++) {
        const int l = (uint16_t)a[j] & 0xff;
        lo[j] = (uint8_t)l;
        hi[j] = (int8_t)((a[j] - l) / 256);
    }
    for (int v = 0; v < DS4N_INT_GROUP / 32; v++)
        for (int s = 0; s < 16; s++) {
            const int j = 32 * v + 2 * order[s];
            pc[32 * v + 2 * s] = (int16_t)(32 * (lo[j] + lo[j + 1]));
            pc[32 * v + 2 * s + 1] = (int16_t)(32 * (hi[j] + hi[j + 1]));
        }
}

/* The byte planes of limb k of token t (ds4n_xq.ab). */
static inline uint8_t *ds4n_xq_lo(const struct ds4n_xq *xq, int64_t t, int k) {
    return xq->ab + (t * (xq->limbs - 1) + k) * 4 * xq->lda;
}
static inline int8_t *ds4n_xq_hi(const struct ds4n_xq *xq, int64_t t, int k) {
    return (int8_t *)(ds4n_xq_lo(xq, t, k) + xq->lda);
}
static inline int16_t *ds4n_xq_pc(const struct ds4n_xq *xq, int64_t t, int k) {
    return (int16_t *)(ds4n_xq_lo(xq, t, k) + 2 * xq->lda);
}

/* A quantizer over block (ds4n_int_quantize_block or a SIMD version of it), sb_group
 * (ds4n_sb_quantize_group or a SIMD version) and sb_split (ds4n_sb_split_group, a SIMD
 * version, or a no-op on a level whose kernels never read the byte planes), compiled in each
 * SIMD file with its flags (the steps are exact or correctly rounded, so every build gives
 * the same limbs). */
#define DS4N_INT_DEFINE_QUANTIZE(fname, block, sb_group, sb_split)                             \
    void fname(struct ds4n_xq *xq, const float *X, int64_t t0, int64_t t1) {                   \
        const int L = xq->limbs;                                                               \
        if (xq->sb) {                                                                          \
            const int64_t ng = xq->nb / 8;                                                     \
            for (int64_t t = t0; t < t1; t++)                                                  \
                for (int64_t g = 0; g < ng; g++) {                                             \
                    const int64_t o = g * DS4N_INT_GROUP;                                      \
                    sb_group(X + t * xq->K + o, L, xq->a + t * (L - 1) * xq->lda + o, xq->lda, \
                             xq->xs + t * ng + g, xq->asum + t * (L - 1) * xq->nb + 8 * g,     \
                             xq->nb);                                                          \
                    for (int k = 0; xq->ab && k < L - 1; k++)                                  \
                        sb_split(xq->a + (t * (L - 1) + k) * xq->lda + o,                      \
                                 ds4n_xq_lo(xq, t, k) + o, ds4n_xq_hi(xq, t, k) + o,           \
                                 ds4n_xq_pc(xq, t, k) + o);                                    \
                }                                                                              \
            return;                                                                            \
        }                                                                                      \
        for (int64_t t = t0; t < t1; t++)                                                      \
            for (int64_t b = 0; b < xq->nb; b++)                                               \
                block(X + t * xq->K + b * QK, L, xq->q + t * L * xq->K + b * QK, xq->K,        \
                      xq->xs + t * xq->nb + b, xq->bsum + t * xq->nb + b);                     \
    }

/* One weight row against tokens [t0, t0 + T) of xq (T in 1..DS4N_SMALL_T): y[t*ldy]. */
typedef void (*ds4n_int_fn)(const void *w, const struct ds4n_xq *xq, int64_t t0, int T, float *y,
                            int64_t ldy);

/* The integer kernel of type for the current SIMD level; NULL when the type has none (the
 * float path then serves it). */
ds4n_int_fn ds4n_active_int_kernel(int type);
/* Decode (T = 1) over R (1..DS4N_MV_ROWS) rows, row_stride bytes apart, against token 0 of
 * xq: y[r] is bitwise the ds4n_int_fn's for row r alone. The R weight streams are read in
 * step, as the float path's rows kernels read them: one row at a time, a long row (K 8192)
 * is a single stream that the hardware prefetchers cannot keep at the memory's rate. */
typedef void (*ds4n_int_rows_fn)(const void *w, int64_t row_stride, const struct ds4n_xq *xq,
                                 float *y, int R);
/* The level's rows kernel of type, or NULL: decode then runs the ds4n_int_fn row by row. */
ds4n_int_rows_fn ds4n_active_int_rows(int type);
/* The super-block types' prefill step: groups [g0, g1) of one row against tokens [t0, t0 + T)
 * (T in 1..DS4N_SMALL_T), carried in acc (T × 16 floats, 64-byte aligned; not read when
 * g0 = 0). With y, the last step: y[t*ldy] is then bitwise the kernel's, and acc is not
 * written. It lets prefill walk K in slices that keep a tile's activations in L1. */
typedef void (*ds4n_sb_part_fn)(const void *w, const struct ds4n_xq *xq, int64_t g0, int64_t g1,
                                int64_t t0, int T, float *acc, float *y, int64_t ldy);
ds4n_sb_part_fn ds4n_active_sb_part(int type); /* Q4_K or Q6_K */

/* The kernel tables' entry points, written once for every level's file: each takes its count
 * at run time (R rows, 1..4; T tokens, 1..8) and calls the file's `impl` with it as a
 * constant, so the compiler makes one copy of impl per count (their loops fully unrolled).
 *   DS4N_INT_ROWS_KERNEL: rows_NAME, a ds4n_int_rows_fn over impl(type, w, stride, xq, y, R)
 *   DS4N_INT_ROW_KERNEL:  int_NAME,  a ds4n_int_fn over impl(type, w, xq, t0, y, ldy, T)
 *   DS4N_INT_PART_KERNEL: part_NAME, a ds4n_sb_part_fn over
 *                         impl(type, w, xq, g0, g1, t0, acc, y, ldy, T) */
#define DS4N_INT_ROWS_KERNEL(name, type, impl)                                                 \
    static void rows_##name(const void *w, int64_t stride, const struct ds4n_xq *xq, float *y, \
                            int R) {                                                           \
        switch (R) {                                                                           \
        case 1: impl(type, w, stride, xq, y, 1); break;                                        \
        case 2: impl(type, w, stride, xq, y, 2); break;                                        \
        case 3: impl(type, w, stride, xq, y, 3); break;                                        \
        default: impl(type, w, stride, xq, y, 4); break;                                       \
        }                                                                                      \
    }
#define DS4N_INT_ROW_CASE(T_, type, impl)                                                      \
    case T_: impl(type, w, xq, t0, y, ldy, T_); break;
#define DS4N_INT_ROW_KERNEL(name, type, impl)                                                  \
    static void int_##name(const void *w, const struct ds4n_xq *xq, int64_t t0, int T, float *y, \
                           int64_t ldy) {                                                      \
        switch (T) {                                                                           \
            DS4N_INT_ROW_CASE(1, type, impl) DS4N_INT_ROW_CASE(2, type, impl)                  \
            DS4N_INT_ROW_CASE(3, type, impl) DS4N_INT_ROW_CASE(4, type, impl)                  \
            DS4N_INT_ROW_CASE(5, type, impl) DS4N_INT_ROW_CASE(6, type, impl)                  \
            DS4N_INT_ROW_CASE(7, type, impl)                                                   \
        default: impl(type, w, xq, t0, y, ldy, 8); break;                                      \
        }                                                                                      \
    }
#define DS4N_INT_PART_CASE(T_, type, impl)                                                     \
    case T_: impl(type, w, xq, g0, g1, t0, acc, y, ldy, T_); break;
#define DS4N_INT_PART_KERNEL(name, type, impl)                                                 \
    static void part_##name(const void *w, const struct ds4n_xq *xq, int64_t g0, int64_t g1,  \
                            int64_t t0, int T, float *acc, float *y, int64_t ldy) {            \
        switch (T) {                                                                           \
            DS4N_INT_PART_CASE(1, type, impl) DS4N_INT_PART_CASE(2, type, impl)                \
            DS4N_INT_PART_CASE(3, type, impl) DS4N_INT_PART_CASE(4, type, impl)                \
            DS4N_INT_PART_CASE(5, type, impl) DS4N_INT_PART_CASE(6, type, impl)                \
            DS4N_INT_PART_CASE(7, type, impl)                                                  \
        default: impl(type, w, xq, g0, g1, t0, acc, y, ldy, 8); break;                         \
        }                                                                                      \
    }
_Static_assert(DS4N_MV_ROWS == 4, "DS4N_INT_ROWS_KERNEL covers 1..4 rows");
_Static_assert(DS4N_SMALL_T == 8, "DS4N_INT_ROW_KERNEL and DS4N_INT_PART_KERNEL cover 1..8 tokens");

/* Prefill of the super-block types on a level with a tile kernel: a panel of rows unpacked
 * once (code·scale as int16, the scales beside) serves every token of a chunk, and the tile
 * kernel runs R rows x C tokens of it (R <= DS4N_SB_TILE_R, C <= DS4N_SB_TILE_C) with every
 * product of a super-block in registers: each weight vector loaded serves C tokens, each
 * activation vector R rows. The arithmetic per (row, token) is ds4n_sb_group_ref's, in the
 * same order, so the results are bitwise the part kernels'. */
#ifndef DS4N_SB_TILE_R
#define DS4N_SB_TILE_R 2
#endif
#ifndef DS4N_SB_TILE_C
#define DS4N_SB_TILE_C 4
#endif
struct ds4n_sb_panel {
    int64_t ng;    /* super-blocks per row */
    int16_t *w;    /* row i, super-block g: w + (i*ng + g)*DS4N_INT_GROUP, 64-byte aligned */
    float *d;      /* [i*ng + g]; dmin likewise (Q4_K only) */
    float *dmin;
    int32_t *m;    /* [(i*ng + g)*8 + j]: Q4_K's sub-block mins */
};
/* Bytes of a panel of rows x ng super-blocks (64-byte aligned parts), and its layout in buf. */
size_t ds4n_sb_panel_bytes(int64_t rows, int64_t ng);
void ds4n_sb_panel_init(struct ds4n_sb_panel *p, void *buf, int64_t rows, int64_t ng);
/* Unpacks super-blocks [0, ng) of one weight row into the panel's row i. */
typedef void (*ds4n_sb_unpack_fn)(int type, const uint8_t *row, struct ds4n_sb_panel *p, int64_t i);
/* Rows [i0, i0 + R) of the panel against tokens [t0, t0 + C) of xq over super-blocks
 * [g0, g1), carried in acc ((r*DS4N_SB_TILE_C + t)*16 floats; not read when g0 = 0); with y,
 * the last step: y[t*ldy + r] is written and acc is not. */
typedef void (*ds4n_sb_tile_fn)(int type, const struct ds4n_sb_panel *p, int64_t i0, int R,
                                const struct ds4n_xq *xq, int64_t t0, int C, int64_t g0,
                                int64_t g1, float *acc, float *y, int64_t ldy);
/* The level's tile kernel and unpacker, or NULL: the part kernels serve prefill. */
ds4n_sb_tile_fn ds4n_active_sb_tile(void);
ds4n_sb_unpack_fn ds4n_active_sb_unpack(void);
void ds4n_int_select(int level); /* called by ds4n_set_simd */

/* The limb count in force on this thread: the pool's (ds4n_pool_set_precision) while it runs
 * a job, 0 (exact float path) elsewhere. */
int ds4n_thread_limbs(void);

/* ---- the reference arithmetic, shared by the scalar kernels and the SIMD kernels' tails ---- */

/* One group of one weight row, unpacked: codes of its n blocks, each block's weight scale
 * and mb. */
struct ds4n_int_group {
    int n;
    uint8_t c[DS4N_INT_GROUP];
    float ws[8], mb[8];
};

/* The scales of the group starting at block b0 of a row (blocks [b0, b0 + n), n <= 8). */
static inline void ds4n_int_scales(int type, const uint8_t *row, int64_t b0, int n,
                                   struct ds4n_int_group *g) {
    g->n = n;
    switch (type) {
    case DS4N_Q4_1: /* y = d·c + m: the min goes with the block sums (negated) */
        for (int b = 0; b < n; b++) {
            const block_q4_1 *p = (const block_q4_1 *)row + b0 + b;
            g->ws[b] = ds4n_f16_to_f32(p->d);
            g->mb[b] = -ds4n_f16_to_f32(p->m);
        }
        break;
    default: /* DS4N_Q8_0, DS4N_Q4_0 */
        for (int b = 0; b < n; b++) {
            const uint8_t *p = row + (b0 + b) * (type == DS4N_Q8_0 ? sizeof(block_q8_0)
                                                                  : sizeof(block_q4_0));
            uint16_t d16;
            memcpy(&d16, p, 2); /* d leads both layouts */
            g->ws[b] = ds4n_f16_to_f32(d16);
            g->mb[b] = g->ws[b] * (type == DS4N_Q8_0 ? 128.0f : 8.0f);
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
    default: /* DS4N_Q4_0, DS4N_Q4_1 */
        for (int b = 0; b < n; b++) {
            const uint8_t *qs = type == DS4N_Q4_0 ? ((const block_q4_0 *)row + b0 + b)->qs
                                                  : ((const block_q4_1 *)row + b0 + b)->qs;
            for (int j = 0; j < QK / 2; j++) {
                g->c[32 * b + j] = qs[j] & 0x0f;
                g->c[32 * b + j + 16] = qs[j] >> 4;
            }
        }
        break;
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
            const float w = g->ws[b] * xs[b];
            acc[l] = fmaf(f, w, acc[l]);
        }
    for (int b = 0; b < g->n; b++)
        accm[b] = fmaf(g->mb[b] * xs[b], xq->bsum[t * xq->nb + b0 + b], accm[b]);
}

/* y = tree(acc[0..16)) - tree(accm[0..8)). */
static inline float ds4n_int_finish(float acc[16], float accm[8]) {
    for (int n = 8; n >= 1; n /= 2)
        for (int i = 0; i < n; i++) acc[i] += acc[i + n];
    for (int n = 4; n >= 1; n /= 2)
        for (int i = 0; i < n; i++) accm[i] += accm[i + n];
    return acc[0] - accm[0];
}

/* One super-block of a Q4_K or Q6_K row, unpacked for the super-block format. */
struct ds4n_sb_weights {
    int16_t w[DS4N_INT_GROUP]; /* code·scale, in value order */
    float d, dmin;             /* dmin: Q4_K only */
    int32_t m[8];              /* Q4_K's 6-bit sub-block mins; zero for Q6_K */
};

static inline void ds4n_sb_unpack(int type, const uint8_t *blk, struct ds4n_sb_weights *u) {
    if (type == DS4N_Q4_K) {
        const block_q4_K *p = (const block_q4_K *)blk;
        u->d = ds4n_f16_to_f32(p->d);
        u->dmin = ds4n_f16_to_f32(p->dmin);
        for (int s = 0; s < 8; s++) {
            uint8_t sc, m;
            ds4n_k_scale_min(p->scales, s, &sc, &m);
            u->m[s] = m;
            for (int j = 0; j < 32; j++) {
                const uint8_t q = p->qs[32 * (s / 2) + j];
                u->w[32 * s + j] = (int16_t)((s % 2 ? q >> 4 : q & 0x0f) * sc);
            }
        }
        return;
    }
    const block_q6_K *p = (const block_q6_K *)blk; /* DS4N_Q6_K */
    u->d = ds4n_f16_to_f32(p->d);
    u->dmin = 0.0f;
    memset(u->m, 0, sizeof u->m);
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = p->ql + 64 * h, *qh = p->qh + 32 * h;
        int16_t *w = u->w + 128 * h;
        const int8_t *sc = p->scales + 8 * h;
        for (int l = 0; l < 32; l++) {
            const int q[4] = {(ql[l] & 0x0f) | ((qh[l] >> 0) & 3) << 4,
                              (ql[l + 32] & 0x0f) | ((qh[l] >> 2) & 3) << 4,
                              (ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4,
                              (ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4};
            for (int r = 0; r < 4; r++)
                w[32 * r + l] = (int16_t)((q[r] - 32) * sc[(32 * r + l) / 16]);
        }
    }
}

/* Super-block g of a row (unpacked in u) against token t of xq, into acc[16]. */
static inline void ds4n_sb_group_ref(int type, const struct ds4n_sb_weights *u,
                                     const struct ds4n_xq *xq, int64_t t, int64_t g,
                                     float acc[16]) {
    const int nl = xq->limbs - 1;
    const float xs = xq->xs[t * (xq->nb / 8) + g];
    float f[16];
    for (int k = 0; k < nl; k++) {
        const int16_t *a = xq->a + (t * nl + k) * xq->lda + g * DS4N_INT_GROUP;
        for (int l = 0; l < 16; l++) {
            int32_t A = 0;
            for (int i = 0; i < 8; i++)
                for (int j = 32 * i + 2 * l; j < 32 * i + 2 * l + 2; j++) A += u->w[j] * a[j];
            f[l] = k == 0 ? (float)A : fmaf((float)A, 0x1p-7f, f[l]);
        }
    }
    const float D = u->d * xs;
    for (int l = 0; l < 16; l++) acc[l] = fmaf(f[l], D, acc[l]);
    if (type != DS4N_Q4_K) return;
    const float Dm = u->dmin * xs;
    const int32_t *as = xq->asum + t * nl * xq->nb + 8 * g;
    for (int j = 0; j < 8; j++) {
        float m = (float)(u->m[j] * as[j]);
        if (nl == 2) m = fmaf((float)(u->m[j] * as[xq->nb + j]), 0x1p-7f, m);
        acc[j] = fmaf(-m, Dm, acc[j]);
    }
}

/* y from a super-block row's acc: the same tree as ds4n_int_finish's. */
static inline float ds4n_sb_finish(const float acc[16]) {
    float a[16];
    memcpy(a, acc, sizeof a);
    for (int n = 8; n >= 1; n /= 2)
        for (int i = 0; i < n; i++) a[i] += a[i + n];
    return a[0];
}

/* Bytes per group of a block-format type (Q8_0, Q4_0, Q4_1). */
static inline int64_t ds4n_int_group_bytes(int type) {
    switch (type) {
    case DS4N_Q8_0: return 8 * (int64_t)sizeof(block_q8_0);
    case DS4N_Q4_0: return 8 * (int64_t)sizeof(block_q4_0);
    default: return 8 * (int64_t)sizeof(block_q4_1);
    }
}

/* A SIMD level's own kernels: every table entry non-NULL for the types the scalar level
 * serves; the part kernels for Q4_K and Q6_K. */
typedef void (*ds4n_xq_quantize_fn)(struct ds4n_xq *xq, const float *X, int64_t t0, int64_t t1);
struct ds4n_int_set {
    ds4n_int_fn row[DS4N_TYPE_SLOTS];
    ds4n_int_rows_fn rows[DS4N_TYPE_SLOTS];
    ds4n_sb_part_fn part[2]; /* Q4_K, Q6_K */
    ds4n_sb_tile_fn tile;
    ds4n_sb_unpack_fn unpack;
    ds4n_xq_quantize_fn quantize;
};

/* A level file's set, from its kernels' shared names (int_*, rows_*, part_*, xq_quantize:
 * static in each level's file) and its prefill tile and unpacker (NULL, NULL: prefill on the
 * part kernels). */
#define DS4N_INT_DEFINE_SET(name, tile_fn, unpack_fn)                                              \
    const struct ds4n_int_set name = {                                                             \
        .row = {[DS4N_Q8_0] = int_q8_0, [DS4N_Q4_0] = int_q4_0, [DS4N_Q4_1] = int_q4_1,            \
                [DS4N_Q4_K] = int_q4_K, [DS4N_Q6_K] = int_q6_K},                                   \
        .rows = {[DS4N_Q8_0] = rows_q8_0, [DS4N_Q4_0] = rows_q4_0, [DS4N_Q4_1] = rows_q4_1,        \
                 [DS4N_Q4_K] = rows_q4_K, [DS4N_Q6_K] = rows_q6_K},                                \
        .part = {part_q4_K, part_q6_K},                                                            \
        .tile = tile_fn,                                                                           \
        .unpack = unpack_fn,                                                                       \
        .quantize = xq_quantize,                                                                   \
    }

/* The level's own set in force, or NULL: the scalar kernels serve every level without one. */
const struct ds4n_int_set *ds4n_active_int_set(void);

#if defined(__x86_64__) || defined(_M_X64)
extern const struct ds4n_int_set ds4n_int_avx512; /* usable when the CPU has AVX-512 VNNI */
extern const struct ds4n_int_set ds4n_int_avx2;   /* AVX2, and AVX-512 without VNNI */
#endif
#if defined(__aarch64__)
extern const struct ds4n_int_set ds4n_int_neon; /* every AArch64 CPU */
/* The block-format kernels with SDOT (the rest NULL: ds4n_int_neon's), usable when the CPU
 * has FEAT_DotProd. */
extern const struct ds4n_int_set ds4n_int_neon_dotprod;
#endif

#endif
