/* Decode matvecs on AMX tiles (Intel AMX-TILE and AMX-BF16 with AVX-512 and AVX512-BF16;
 * compiled with those flags, used only at the "amx" level, which checks all of them and asks
 * the kernel for the tile state first).
 *
 * One pass serves 1..5 tokens: y[t][r] = Σ_b d_rb · Σ_k q_rbk · x_tbk (+ m_rb · Σ_k x_tbk for
 * Q4_1), for the 32-value block types with 4-bit codes whose values are exactly bf16 through
 * a 16-entry table: Q4_0, Q4_1, IQ4_NL and MXFP4. (Q8_0 stays on the AVX-512 kernels: widening
 * its 8-bit codes to bf16 costs more than their whole dot.) The activations stay float32:
 * each x is split exactly into three bf16 pieces (h = x with its low 16 bits cleared, m the
 * same of x - h, l = x - h - m), so every product q·piece is exact in the tile unit's float32
 * FMAs and the three sums add up to Σ q·x with float32 rounding, as a float32 dot would.
 *
 * Per block of 16 rows: A (16 rows x 32 codes, bf16) is decoded by AVX-512 into a buffer and
 * loaded as a tile; B (32 codes x 3 columns per token: the pieces, in A's code order) is built
 * once per call for every block; C = A·B (16 rows x 3T, float32) is stored compactly (3T
 * vectors of 16 floats, each value scaled by its row's d through a lane permute of the 16
 * scales) and accumulated in float32 lanes. Decoding runs two blocks ahead of the tile
 * product and the scaling two blocks behind it, so the tile loads never wait on the stores
 * that fill their buffers.
 *
 * The tile store that takes C out of the tile unit is a fixed cost per block and row tile
 * (the core does little else while it runs), the same for one token as for five: one token
 * costs about what the AVX-512 rows kernel does, four about 1.7 times that (the rows and
 * small-batch kernels: 2.7 times).
 *
 * Every float operation on one (row, token) is the same whatever the other rows and tokens of
 * the call (tile elements are computed independently, lanes never mix), so a token's result
 * is bitwise the same alone (T = 1) and in a batch: the decode and small-batch paths are one
 * kernel. 6..8 tokens run as two passes. */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "nibble_tables.h"
#include "quants.h"
#include "quants_avx512.h"

#define MAX_BLOCKS 256   /* rows of up to 8192 values: B of one pass on the stack */
#define PASS_T 5         /* tokens per pass: 3 pieces each in a tile's 16 columns */
#define RING 4           /* A, C and scale buffers in flight */
#define PREFETCH_TILES 2 /* how far ahead the row tiles are prefetched */

#define INLINE static inline __attribute__((always_inline))

struct tile_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

/* A in tiles 0/1, B in 2/3, C in 4/5 (alternating blocks); C and B have n float columns. */
static void configure(int n) {
    struct tile_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 6; t++) {
        c.rows[t] = 16;
        c.colsb[t] = (uint16_t)(t < 2 ? 64 : 4 * n);
    }
    /* Not _tile_loadconfig: some compilers' version tells the optimizer it reads 8 bytes. */
    __asm__ volatile("ldtilecfg %0" ::"m"(c));
}

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

int ds4n_amx_usable(void) {
    unsigned a, b, c, d;
    __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
    const int tile = (d >> 24) & 1, bf16 = (d >> 22) & 1;
    __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(1));
    const int avx512_bf16 = (a >> 5) & 1;
    if (!tile || !bf16 || !avx512_bf16) return 0;
    __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(1), "c"(0));
    if (!((c >> 27) & 1)) return 0; /* OSXSAVE */
    unsigned lo, hi;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 0x60000) != 0x60000) return 0; /* XTILECFG and XTILEDATA enabled */
    /* Linux hands out the 8 KB tile state per process on request (5.16 and later). */
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

/* ---- codes ------------------------------------------------------------------------------ */

/* Code index k (0..31 in the block) held by A element w for the 4-bit types: A is decoded from
 * four copies of the 16 code bytes, copy c keeping nibble c of each 16-bit word, so element
 * w = 8c + i is nibble c of bytes (2i, 2i+1): low then high nibble of each. */
static int nibble_code(int w) {
    const int c = w / 8, i = w % 8;
    return (c % 2 ? 16 : 0) + 2 * i + c / 2;
}

/* bf16 of each table value (exact: at most 8 significant bits), twice, for vpermw's 5-bit
 * indices (the fifth bit is the next nibble's). */
static __m512i bf16_table(const int8_t *values) {
    _Alignas(64) uint16_t t[32];
    for (int j = 0; j < 32; j++) {
        const float f = (float)values[j % 16];
        uint32_t u;
        memcpy(&u, &f, 4);
        t[j] = (uint16_t)(u >> 16);
    }
    return _mm512_load_si512(t);
}

struct kind {
    int type;
    int64_t block_bytes, qs_offset;
    int affine; /* Q4_1: a per-block min times Σx */
};

INLINE void decode_row(const struct kind *k, const uint8_t *blk, uint16_t *a, __m512i shifts,
                       __m512i table) {
    const __m512i v = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(blk + k->qs_offset)));
    _mm512_store_si512(a, _mm512_permutexvar_epi16(_mm512_srlv_epi16(v, shifts), table));
}

/* The 16 rows' scales (and Q4_1's mins) of one block from their first 4 bytes. */
INLINE void block_scales(const struct kind *k, __m512i raw, __m512 *d, __m512 *m) {
    if (k->type == DS4N_MXFP4) { /* an E8M0 byte: half of 2^(e-127), as the scalar kernel */
        const __m512i e = _mm512_and_si512(raw, _mm512_set1_epi32(0xff));
        const __mmask16 small = _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2));
        const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
        const __m512i sub = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
        *d = _mm512_castsi512_ps(_mm512_mask_blend_epi32(small, normal, sub));
        *m = _mm512_setzero_ps();
        return;
    }
    const __m512 lo = _mm512_cvtph_ps(_mm512_castsi512_si256(raw));
    const __m512 hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(raw, 1));
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    *d = _mm512_permutex2var_ps(lo, even, hi);
    *m = _mm512_permutex2var_ps(lo, _mm512_add_epi32(even, _mm512_set1_epi32(1)), hi);
}

/* ---- B: the activations' pieces -------------------------------------------------------- */

/* B of every block for tokens x[t*ldx], t < nt: block b is 16 rows (code pairs) of 3*nt
 * dwords, row i column 3t+p holding piece p of the values at A elements 2i and 2i+1. xs[t][b]
 * = Σ of block b of token t (in a fixed order). */
static void build_b(const struct kind *k, const float *x, int64_t ldx, int nt, int64_t nb,
                    uint32_t *B, float *xs) {
    const int n = 3 * nt;
    _Alignas(64) int32_t order[32];
    for (int w = 0; w < 32; w++) order[w] = nibble_code(w);
    const __m512i o0 = _mm512_load_si512(order), o1 = _mm512_load_si512(order + 16);
    const __m512i high = _mm512_set1_epi32((int)0xffff0000u);
    /* dword i of a piece goes to row i, column c: index i*n + c */
    const __m512i rows = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32(n));
    for (int t = 0; t < nt; t++)
        for (int64_t b = 0; b < nb; b++) {
            const float *xb = x + t * ldx + b * QK;
            const __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps(xb + 16);
            if (k->affine) xs[t * nb + b] = ds4n_hsum_avx512(_mm512_add_ps(x0, x1));
            __m512 v[2] = {_mm512_permutex2var_ps(x0, o0, x1), _mm512_permutex2var_ps(x0, o1, x1)};
            uint32_t *bb = B + b * 16 * n;
            for (int p = 0; p < 3; p++) {
                __m512 piece[2];
                for (int h = 0; h < 2; h++) {
                    piece[h] = p < 2 ? _mm512_castsi512_ps(
                                           _mm512_and_si512(_mm512_castps_si512(v[h]), high))
                                     : v[h];
                    v[h] = _mm512_sub_ps(v[h], piece[h]); /* exact: the bits below */
                }
                const __m512i pairs = (__m512i)_mm512_cvtne2ps_pbh(piece[1], piece[0]);
                _mm512_i32scatter_epi32(bb, _mm512_add_epi32(rows, _mm512_set1_epi32(3 * t + p)),
                                        pairs, 4);
            }
        }
}

/* ---- the pass ---------------------------------------------------------------------------- */

struct pass {
    const struct kind *k;
    const uint8_t *w;
    int64_t row_bytes, n_rows, nb;
    int nt;
    const uint32_t *B;
    const float *xs;
    float *y;
    int64_t ldy;
};

/* Rows [r0, r0 + 16) of the pass (fewer at the matrix end). The tile's rows are one
 * contiguous run, read here block by block across its rows, an order the hardware
 * prefetchers do not follow: the run PREFETCH_TILES tiles ahead is prefetched, spread over the
 * blocks, so memory still sees one sequential stream. */
INLINE void row_tile(const struct pass *p, int64_t r0, const int nt, const __m512i table,
                     const __m512i shifts, const __m512i row_offsets) {
    const struct kind *k = p->k;
    const int64_t nb = p->nb;
    const int n = 3 * nt; /* C of one block: 16 rows x n floats, stored as n vectors */
    _Alignas(64) uint16_t A[RING][16 * 32];
    _Alignas(64) float C[RING][16 * 16];
    _Alignas(64) uint32_t raw[RING][16];
    /* Lane j of C vector v is row (16v + j) / n: the permutes that spread the 16 rows' scales
     * over C's compact rows. */
    _Alignas(64) int32_t spread[3 * PASS_T][16];
    for (int v = 0; v < n; v++)
        for (int j = 0; j < 16; j++) spread[v][j] = (16 * v + j) / n;
    const int here = p->n_rows - r0 < 16 ? (int)(p->n_rows - r0) : 16;
    const __mmask16 valid = (__mmask16)((1u << here) - 1);
    const uint8_t *tile_w = p->w + r0 * p->row_bytes;
    const int64_t tile_bytes = 16 * p->row_bytes;
    const char *ahead = (const char *)tile_w + PREFETCH_TILES * tile_bytes;
    const char *end = (const char *)p->w + p->n_rows * p->row_bytes;
    const int64_t per_block = (tile_bytes / 64 + nb - 1) / nb * 64;
    __m512 acc[3 * PASS_T], accm[PASS_T];
    for (int v = 0; v < n; v++) acc[v] = _mm512_setzero_ps();
    for (int t = 0; t < nt; t++) accm[t] = _mm512_setzero_ps();

#define DECODE(i)                                                                            \
    do {                                                                                     \
        const uint8_t *blk = tile_w + (i) * k->block_bytes;                                  \
        for (int r = 0; r < here; r++)                                                       \
            decode_row(k, blk + r * p->row_bytes, A[(i) % RING] + 32 * r, shifts, table);     \
        _mm512_store_si512(raw[(i) % RING],                                                  \
                           _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), valid,        \
                                                       row_offsets, blk, 1));                \
    } while (0)
    /* C is stored compactly (row stride n floats): vector v holds rows (16v + j) / n. */
#define PRODUCT(i, TA, TB, TC)                                                               \
    do {                                                                                     \
        _tile_loadd(TA, A[(i) % RING], 64);                                                  \
        _tile_loadd(TB, p->B + (i) * 16 * n, 4 * n);                                         \
        _tile_zero(TC);                                                                      \
        _tile_dpbf16ps(TC, TA, TB);                                                          \
        _tile_stored(TC, C[(i) % RING], 4 * n);                                              \
    } while (0)
#define SCALE(i)                                                                             \
    do {                                                                                     \
        __m512 d, m;                                                                         \
        block_scales(k, _mm512_load_si512(raw[(i) % RING]), &d, &m);                         \
        if (k->affine)                                                                       \
            for (int t = 0; t < nt; t++)                                                     \
                accm[t] = _mm512_fmadd_ps(m, _mm512_set1_ps(p->xs[t * nb + (i)]), accm[t]);  \
        for (int v = 0; v < n; v++)                                                          \
            acc[v] = _mm512_fmadd_ps(                                                        \
                _mm512_load_ps(C[(i) % RING] + 16 * v),                                      \
                _mm512_permutexvar_ps(_mm512_load_si512(spread[v]), d), acc[v]);             \
    } while (0)
#define STEP(i, TA, TB, TC)                                                                  \
    do {                                                                                     \
        for (const char *a = ahead + (i) * per_block, *e = a + per_block; a < e && a < end;   \
             a += 64)                                                                        \
            _mm_prefetch(a, _MM_HINT_T0);                                                    \
        if ((i) >= 2 && (i) - 2 < nb) SCALE((i) - 2);                                          \
        if ((i) < nb) PRODUCT(i, TA, TB, TC);                                                \
        if ((i) + 2 < nb) DECODE((i) + 2);                                                   \
    } while (0)

    DECODE(0);
    if (nb > 1) DECODE(1);
    for (int64_t i = 0; i < nb + 2; i += 2) {
        STEP(i, 0, 2, 4);
        STEP(i + 1, 1, 3, 5);
    }
#undef STEP
#undef SCALE
#undef PRODUCT
#undef DECODE
    _Alignas(64) float sums[3 * PASS_T * 16], mins[PASS_T][16];
    for (int v = 0; v < n; v++) _mm512_store_ps(sums + 16 * v, acc[v]);
    for (int t = 0; t < nt; t++) _mm512_store_ps(mins[t], accm[t]);
    for (int t = 0; t < nt; t++)
        for (int r = 0; r < here; r++) {
            const float *o = sums + r * n + 3 * t; /* row r's three pieces of token t */
            float s = (o[0] + o[1]) + o[2];
            if (k->affine) s += mins[t][r];
            p->y[t * p->ldy + r0 + r] = s;
        }
}

#define TILE_CASE(NT)                                                                        \
    case NT:                                                                                 \
        for (int64_t r0 = 0; r0 < p->n_rows; r0 += 16)                                        \
            row_tile(p, r0, NT, table, shifts, row_offsets);                                 \
        break;

static void pass_rows(const struct pass *p) {
    const struct kind *k = p->k;
    const int8_t iota16[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    const int8_t minus8[16] = {-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7};
    const __m512i table = bf16_table(k->type == DS4N_Q4_0     ? minus8
                                     : k->type == DS4N_IQ4_NL ? ds4n_iq4nl_values
                                     : k->type == DS4N_MXFP4  ? ds4n_mxfp4_values
                                                              : iota16);
    const __m512i shifts = _mm512_setr_epi64(0, 0, 0x0004000400040004ll, 0x0004000400040004ll,
                                             0x0008000800080008ll, 0x0008000800080008ll,
                                             0x000c000c000c000cll, 0x000c000c000c000cll);
    const __m512i row_offsets = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32((int)p->row_bytes));
    configure(3 * p->nt);
    switch (p->nt) { /* nt a constant in each, so the accumulators stay in registers */
        TILE_CASE(1)
        TILE_CASE(2)
        TILE_CASE(3)
        TILE_CASE(4)
        TILE_CASE(5)
    }
    _tile_release();
}
#undef TILE_CASE

/* y[t*ldy + r] = row r of w · x[t*ldx] for r < n_rows, t < T (1..DS4N_SMALL_T). 0 (nothing
 * done) for a row longer than the stack buffers hold: the caller's other kernels then serve
 * every T alike. */
static int mv(const struct kind *k, const void *w, int64_t row_bytes, int64_t n_rows,
              const float *x, int64_t K, int T, float *y, int64_t ldy) {
    const int64_t nb = K / QK;
    if (K % QK || nb > MAX_BLOCKS || T < 1 || T > DS4N_SMALL_T) return 0;
    if (n_rows <= 0) return 1;
    _Alignas(64) uint32_t B[MAX_BLOCKS * 16 * 3 * PASS_T];
    float xs[PASS_T * MAX_BLOCKS];
    const int per_pass = T > PASS_T ? 4 : PASS_T; /* 6..8 tokens: 4, then the rest */
    for (int t0 = 0; t0 < T; t0 += per_pass) {
        const int nt = T - t0 < per_pass ? T - t0 : per_pass;
        build_b(k, x + t0 * K, K, nt, nb, B, xs);
        const struct pass p = {k, w, row_bytes, n_rows, nb, nt, B, xs, y + t0 * ldy, ldy};
        pass_rows(&p);
    }
    return 1;
}

#define DS4N_AMX_MV(name, T, block, offset, affine)                                          \
    static int mv_##name(const void *w, int64_t row_bytes, int64_t n_rows, const float *x,  \
                         int64_t K, int nt, float *y, int64_t ldy) {                         \
        static const struct kind k = {T, sizeof(block), offset, affine};                    \
        return mv(&k, w, row_bytes, n_rows, x, K, nt, y, ldy);                               \
    }
DS4N_AMX_MV(q4_0, DS4N_Q4_0, block_q4_0, 2, 0)
DS4N_AMX_MV(q4_1, DS4N_Q4_1, block_q4_1, 4, 1)
DS4N_AMX_MV(iq4_nl, DS4N_IQ4_NL, block_iq4_nl, 2, 0)
DS4N_AMX_MV(mxfp4, DS4N_MXFP4, block_mxfp4, 1, 0)

const ds4n_mv_fn ds4n_amx_mv[DS4N_TYPE_SLOTS] = {
    [DS4N_Q4_0] = mv_q4_0,
    [DS4N_Q4_1] = mv_q4_1,
    [DS4N_IQ4_NL] = mv_iq4_nl,
    [DS4N_MXFP4] = mv_mxfp4,
};
