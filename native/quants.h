/* Internal to the kernel library: GGML block layouts, per-type traits, and the kernel
 * sets each SIMD level provides. Not part of the ctypes ABI (that is ds4n.h). */
#ifndef DS4N_QUANTS_H
#define DS4N_QUANTS_H

#include <stdint.h>
#include <string.h>

#include "ds4n.h"

#define QK 32    /* values per block of the legacy types (Q4_0 .. Q8_0), IQ4_NL and MXFP4 */
#define QK_K 256 /* values per super-block of the K-quants, IQ2_XXS and IQ4_XS */

/* Block layouts, byte-compatible with GGML (all members are naturally aligned). */
typedef struct { uint16_t d; uint8_t qs[QK / 2]; } block_q4_0;
typedef struct { uint16_t d, m; uint8_t qs[QK / 2]; } block_q4_1;
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[QK / 2]; } block_q5_0;
typedef struct { uint16_t d, m; uint8_t qh[4]; uint8_t qs[QK / 2]; } block_q5_1;
typedef struct { uint16_t d; int8_t qs[QK]; } block_q8_0;
typedef struct { uint8_t scales[QK_K / 16]; uint8_t qs[QK_K / 4]; uint16_t d, dmin; } block_q2_K;
typedef struct {
    uint8_t hmask[QK_K / 8]; uint8_t qs[QK_K / 4]; uint8_t scales[12]; uint16_t d;
} block_q3_K;
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[QK_K / 2]; } block_q4_K;
typedef struct {
    uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2];
} block_q5_K;
typedef struct {
    uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; uint16_t d;
} block_q6_K;
typedef struct { uint16_t d; uint16_t qs[QK_K / 8]; } block_iq2_xxs;
typedef struct { uint16_t d; uint8_t qs[QK / 2]; } block_iq4_nl;
typedef struct {
    uint16_t d, scales_h; uint8_t scales_l[QK_K / 64]; uint8_t qs[QK_K / 2];
} block_iq4_xs;
typedef struct { uint8_t e; uint8_t qs[QK / 2]; } block_mxfp4; /* e: an E8M0 exponent */

/* IEEE half -> float, exact (subnormals, inf and nan included). */
static inline float ds4n_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (mant << 13);
    } else if (mant == 0) {
        bits = sign;
    } else { /* subnormal: normalise */
        exp = 113;
        while (!(mant & 0x400)) { mant <<= 1; exp--; }
        bits = sign | (exp << 23) | ((mant & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline float ds4n_bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Half the E8M0 scale 2^(e-127), exactly (MXFP4's value table is doubled to match): 2^(e-128),
 * a subnormal for e < 2; e = 255 (NaN in the MX format) is read as 2^127, as GGML does. */
static inline float ds4n_e8m0_to_f32_half(uint8_t e) {
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Q4_K / Q5_K pack eight 6-bit (scale, min) pairs into 12 bytes. */
static inline void ds4n_k_scale_min(const uint8_t *s, int j, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* All eight pairs of ds4n_k_scale_min at once, four bytes at a time: the scales in *sc and
 * the mins in *mn, pair j in byte j (the SIMD levels' Q4_K unpacking). */
static inline void ds4n_k_scale_min8(const uint8_t *s, uint64_t *sc, uint64_t *mn) {
    uint32_t a, b, c;
    memcpy(&a, s, 4), memcpy(&b, s + 4, 4), memcpy(&c, s + 8, 4);
    *sc = (uint64_t)(a & 0x3f3f3f3f) | (uint64_t)((c & 0x0f0f0f0f) | ((a >> 6) & 0x03030303) << 4) << 32;
    *mn = (uint64_t)(b & 0x3f3f3f3f) |
          (uint64_t)(((c >> 4) & 0x0f0f0f0f) | ((b >> 6) & 0x03030303) << 4) << 32;
}

/* dequant_q4_K and dequant_q5_K over a kernel sub32(d, dmin, scales, qs, qh or NULL, y) that
 * expands one super-block: the two types differ only in Q5_K's fifth bits. */
#define DS4N_DEFINE_Q45_K_DEQUANT(sub32)                                      \
    static void dequant_q4_K(const void *src, float *y, int64_t n) {         \
        const block_q4_K *b = src;                                            \
        for (int64_t i = 0; i < n / QK_K; i++, y += QK_K)                     \
            sub32(b[i].d, b[i].dmin, b[i].scales, b[i].qs, NULL, y);          \
    }                                                                         \
    static void dequant_q5_K(const void *src, float *y, int64_t n) {         \
        const block_q5_K *b = src;                                            \
        for (int64_t i = 0; i < n / QK_K; i++, y += QK_K)                     \
            sub32(b[i].d, b[i].dmin, b[i].scales, b[i].qs, b[i].qh, y);       \
    }

/* Q3_K packs sixteen 6-bit signed scales into 12 bytes. */
static inline int ds4n_q3_K_scale(const uint8_t *s, int g) {
    int lo = g < 8 ? s[g] & 0x0f : s[g - 8] >> 4;
    int hi = (s[8 + g % 4] >> (2 * (g / 4))) & 3;
    return (lo | hi << 4) - 32;
}

/* IQ4_XS: the signed 6-bit scale of sub-block ib (of 8): 4 low bits in scales_l, 2 high bits
 * in scales_h, offset by 32. */
static inline int ds4n_iq4_xs_scale(const block_iq4_xs *b, int ib) {
    int lo = (b->scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0f;
    int hi = (b->scales_h >> (2 * ib)) & 3;
    return (lo | hi << 4) - 32;
}

/* Row kernels of one type at one SIMD level; n is a multiple of the block size. */
typedef void (*ds4n_dequant_fn)(const void *src, float *dst, int64_t n);
typedef float (*ds4n_dot_fn)(const void *w, const float *x, int64_t n);
/* Decode matvec over R (1..DS4N_MV_ROWS) rows, row_stride bytes apart: y[r] = row r · x.
 * Each block of x is loaded once for all R rows, and the R weight streams are read in step.
 * xsum[b] = Σ x[32b .. 32b+32): the types with a per-block min fold it in as min·xsum. */
typedef void (*ds4n_rows_fn)(const void *w, int64_t row_stride, const float *x,
                             const float *xsum, int64_t n, float *y, int R);
#define DS4N_MV_ROWS 4
/* Small-batch matvec tile: R (1..DS4N_MV_ROWS) rows, row_stride bytes apart, against T
 * (1..DS4N_SMALL_T) activation rows x + t*ldx: y[t*ldy + r] = row r · token t. Each block of
 * every row is decoded once for all T tokens (and, in the tiled kernels, each token's block
 * of x loaded once for all R rows). y[t*ldy + r] is bitwise what the single-token path gives
 * for row r and token t alone: the rows kernel's arithmetic when the set has one for the
 * type, else the dot kernel's. With a rows kernel, xsum + t*(n/32) are token t's per-32 sums,
 * and xsum + T*(n/32) the same sums block-major (token t of 32-block b at b*T + t, 8 floats
 * readable past the last), so a kernel can take one block's sums of every token in one
 * vector load. */
typedef void (*ds4n_cols_fn)(const void *w, int64_t row_stride, const float *x, int64_t ldx,
                             const float *xsum, int64_t n, float *y, int64_t ldy, int R, int T);
#define DS4N_SMALL_T 8
/* Decode and small-batch matvec in one kernel: y[t*ldy + r] = row r · x[t*K] for r < n_rows
 * (row_bytes apart), t < T (1..DS4N_SMALL_T), each token's result bitwise the same whatever T.
 * Returns 0, having done nothing, when it cannot take rows of K values (the decision depends
 * on K alone, so the other kernels then serve every T of that shape). */
typedef int (*ds4n_mv_fn)(const void *w, int64_t row_bytes, int64_t n_rows, const float *x,
                          int64_t K, int T, float *y, int64_t ldy);
struct ds4n_row_kernels {
    ds4n_dequant_fn dequantize;
    ds4n_dot_fn dot;
    ds4n_rows_fn rows; /* NULL: the matvec runs dot row by row */
    ds4n_cols_fn cols; /* NULL: a small batch runs token by token */
    ds4n_mv_fn mv;     /* non-NULL: T <= DS4N_SMALL_T goes here first */
};

/* GEMM micro-kernel: for r < R (1..4) and t < C (1..the set's tile_cols), acc[r][t] =
 * dot(W + r*ldw, X + t*ldx) over k floats; results go to Y[t*ldy + r], added to what is
 * there when accumulate != 0. */
typedef void (*ds4n_tile_fn)(const float *W, int64_t ldw, const float *X, int64_t ldx,
                             int64_t k, float *Y, int64_t ldy, int R, int C, int accumulate);
#define DS4N_TILE_ROWS 4
#define DS4N_TILE_COLS 3      /* tokens per micro-kernel call, unless the set says more */
#define DS4N_TILE_COLS_MAX 6

/* Everything one SIMD level provides. Row-kernel slots left NULL fall back to scalar. */
#define DS4N_TYPE_SLOTS 40 /* type ids are < 40 */
struct ds4n_kernel_set {
    struct ds4n_row_kernels row[DS4N_TYPE_SLOTS];
    ds4n_tile_fn tile;
    int tile_cols; /* C of the micro-kernel (0: DS4N_TILE_COLS) */
    /* 1: the decode matvecs leave every row stream to the hardware prefetchers (matmul.c
     * fetches short rows ahead by hand otherwise), where that measured faster on the
     * level's CPUs. */
    int hw_prefetch;
};

struct ds4n_type_traits {
    const char *name;
    int64_t block_size, block_bytes;
};

/* NULL for a type this library cannot run. */
const struct ds4n_type_traits *ds4n_traits(int type);
/* The kernels in force for the current SIMD level (resolved; never NULL for a supported type). */
const struct ds4n_row_kernels *ds4n_active_kernels(int type);
ds4n_tile_fn ds4n_active_tile(void);
int ds4n_active_tile_cols(void);
int ds4n_active_hw_prefetch(void);

extern const struct ds4n_kernel_set ds4n_scalar_set;
#if defined(__x86_64__) || defined(_M_X64)
extern const struct ds4n_kernel_set ds4n_avx2_set;
extern const struct ds4n_kernel_set ds4n_avx512_set;
/* The AMX level: the AVX-512 set with these decode matvecs (NULL: none for that type). */
extern const ds4n_mv_fn ds4n_amx_mv[DS4N_TYPE_SLOTS];
/* 1 when the CPU has AMX-TILE, AMX-BF16 and AVX512-BF16, the OS enables the tile state and
 * grants it to this process (asked for here). */
int ds4n_amx_usable(void);
#define DS4N_HAVE_AVX2 1
#endif
#if defined(__aarch64__)
extern const struct ds4n_kernel_set ds4n_neon_set;
#define DS4N_HAVE_NEON 1
#endif

#endif
