/* Code the SIMD kernel files (quants_avx2.c, quants_neon.c, matmul_*.c) share, written once
 * against names each includer defines first for its own vector type:
 *   struct legacy_block { float d, m; <vector> q[]; }   the 32 codes of a block as floats
 *   f16(h), unpack_nibbles(qs, qh or NULL, offset, q), unpack_q8(qs, q)
 *   dequant_float / dot_float / dequant_legacy / dot_legacy (type-generic, always inlined)
 */
#ifndef DS4N_QUANTS_SIMD_H
#define DS4N_QUANTS_SIMD_H

#include "quants.h"

#define DS4N_INLINE static inline __attribute__((always_inline))

/* Value i of a float-type row, for the tails shorter than a vector. */
DS4N_INLINE float load_float1(int type, const void *p, int64_t i) {
    switch (type) {
    case DS4N_F16: return ds4n_f16_to_f32(((const uint16_t *)p)[i]);
    case DS4N_BF16: return ds4n_bf16_to_f32(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

static inline int is_affine(int type) { return type == DS4N_Q4_1 || type == DS4N_Q5_1; }

/* Scales and codes of one legacy block (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0). */
#define DS4N_DEFINE_LOAD_LEGACY                                                   \
    DS4N_INLINE void load_legacy(int type, const void *blk, struct legacy_block *b) { \
        b->m = 0.0f;                                                              \
        switch (type) {                                                           \
        case DS4N_Q4_0: {                                                         \
            const block_q4_0 *p = blk;                                            \
            b->d = f16(p->d);                                                     \
            unpack_nibbles(p->qs, NULL, 8, b->q);                                 \
            break;                                                                \
        }                                                                         \
        case DS4N_Q4_1: {                                                         \
            const block_q4_1 *p = blk;                                            \
            b->d = f16(p->d), b->m = f16(p->m);                                   \
            unpack_nibbles(p->qs, NULL, 0, b->q);                                 \
            break;                                                                \
        }                                                                         \
        case DS4N_Q5_0: {                                                         \
            const block_q5_0 *p = blk;                                            \
            b->d = f16(p->d);                                                     \
            unpack_nibbles(p->qs, p->qh, 16, b->q);                               \
            break;                                                                \
        }                                                                         \
        case DS4N_Q5_1: {                                                         \
            const block_q5_1 *p = blk;                                            \
            b->d = f16(p->d), b->m = f16(p->m);                                   \
            unpack_nibbles(p->qs, p->qh, 0, b->q);                                \
            break;                                                                \
        }                                                                         \
        default: { /* DS4N_Q8_0 */                                                \
            const block_q8_0 *p = blk;                                            \
            b->d = f16(p->d);                                                     \
            unpack_q8(p->qs, b->q);                                               \
        }                                                                         \
        }                                                                         \
    }

/* dot_f32 and the dequantize/dot kernels of the float and legacy types, named dequant_<t>
 * and dot_<t> as the ROW() table entries expect. */
#define DS4N_DEFINE_FLOAT_AND_LEGACY_KERNELS                                  \
    static float dot_f32(const void *w, const float *x, int64_t n) {         \
        return dot_float(DS4N_F32, w, x, n);                                  \
    }                                                                         \
    DS4N_FLOAT_KERNELS(f16, DS4N_F16)                                         \
    DS4N_FLOAT_KERNELS(bf16, DS4N_BF16)                                       \
    DS4N_LEGACY_KERNELS(q4_0, DS4N_Q4_0, block_q4_0)                          \
    DS4N_LEGACY_KERNELS(q4_1, DS4N_Q4_1, block_q4_1)                          \
    DS4N_LEGACY_KERNELS(q5_0, DS4N_Q5_0, block_q5_0)                          \
    DS4N_LEGACY_KERNELS(q5_1, DS4N_Q5_1, block_q5_1)                          \
    DS4N_LEGACY_KERNELS(q8_0, DS4N_Q8_0, block_q8_0)

#define DS4N_FLOAT_KERNELS(name, T)                                           \
    static void dequant_##name(const void *s, float *y, int64_t n) {         \
        dequant_float(T, s, y, n);                                            \
    }                                                                         \
    static float dot_##name(const void *w, const float *x, int64_t n) {      \
        return dot_float(T, w, x, n);                                         \
    }

#define DS4N_LEGACY_KERNELS(name, T, block)                                        \
    static void dequant_##name(const void *s, float *y, int64_t n) {              \
        dequant_legacy(T, sizeof(block), s, y, n);                                 \
    }                                                                              \
    static float dot_##name(const void *w, const float *x, int64_t n) {           \
        return dot_legacy(T, sizeof(block), w, x, n);                              \
    }

#define DS4N_ROW(T, name) [DS4N_##T] = {dequant_##name, dot_##name}
#define DS4N_DOT(T, name) [DS4N_##T] = {NULL, dot_##name}

/* The ds4n_tile_fn `fname` over tile_rc(W, ldw, X, ldx, k, Y, ldy, R, C, accumulate) inlined
 * with constant R and C, so every edge tile keeps its accumulators in registers. */
#define DS4N_TILE_CASE(R, C)                                                       \
    case R * 4 + C:                                                                \
        tile_rc(W, ldw, X, ldx, k, Y, ldy, R, C, accumulate);                      \
        break;
#define DS4N_DEFINE_TILE(fname)                                                             \
    void fname(const float *W, int64_t ldw, const float *X, int64_t ldx, int64_t k, float *Y, \
               int64_t ldy, int R, int C, int accumulate) {                                 \
        switch (R * 4 + C) {                                                                \
            DS4N_TILE_CASE(1, 1) DS4N_TILE_CASE(1, 2) DS4N_TILE_CASE(1, 3)                  \
            DS4N_TILE_CASE(2, 1) DS4N_TILE_CASE(2, 2) DS4N_TILE_CASE(2, 3)                  \
            DS4N_TILE_CASE(3, 1) DS4N_TILE_CASE(3, 2) DS4N_TILE_CASE(3, 3)                  \
            DS4N_TILE_CASE(4, 1) DS4N_TILE_CASE(4, 2) DS4N_TILE_CASE(4, 3)                  \
        }                                                                                   \
    }
_Static_assert(DS4N_TILE_ROWS == 4 && DS4N_TILE_COLS == 3, "DS4N_DEFINE_TILE covers 4 x 3");

#endif
