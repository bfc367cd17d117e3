/* Y = X · Wᵀ for quantized W, float32 X and Y. Activations are never quantized.
 *
 * T == 1 (decode): fused dequantize-dot kernels over DS4N_MV_ROWS rows at a time (each block
 * of x loaded once for all of them, the rows from DS4N_MV_ROWS sequential streams); the rows
 * are split across the workers, so each streams its share of the matrix once. The per-32 sums of x are taken once per
 * matvec for the types whose blocks carry a min (min·Σx).
 *
 * 2 <= T <= DS4N_SMALL_T (batched decode of several sessions): each row read once and each
 * of its blocks decoded once for all T tokens, token t's result bitwise the T == 1 one. A
 * kernel set may instead have one kernel for every T <= DS4N_SMALL_T (the AMX level's tile
 * matvec), which then serves decode and small batches alike.
 *
 * T > DS4N_SMALL_T (prefill): blocked matrix-matrix product. Each worker walks its rows in panels of
 * PANEL_ROWS rows x PANEL_K columns, dequantizes a panel once into a float buffer (64 KB,
 * L2-resident) and runs the register-blocked micro-kernel (DS4N_TILE_ROWS rows x the set's
 * tile_cols tokens of SIMD accumulators) over every token against it; each micro-kernel
 * call streams its 3 token rows from L1. Long panels measured best (fewer horizontal sums and
 * partial-sum passes over Y); the typical model row (K <= 1024) is a single panel. */
#include <pthread.h>
#include <stdlib.h>

#include "prefetch.h"
#include "profile.h"
#include "quants.h"
#include "quants_int.h"

#define PANEL_ROWS 16
#define PANEL_K 1024 /* a multiple of every block size */
#define XSUM_MAX 4096 /* per-32 sums of x kept on the stack: rows up to 131072 values */
#define PREFETCH_BYTES 1024  /* how far ahead a decode matvec fetches each of its row streams */
#define PREFETCH_ROW_MAX 1024 /* rows longer than this are left to the hardware prefetchers */

struct matmul_job {
    int type;
    const void *W;
    int64_t rows, K, T;
    const float *X;
    float *Y;
};

/* Rows [begin, end) of worker ith: contiguous, in whole micro-kernel tiles. */
static void share(int64_t rows, int ith, int nth, int64_t *begin, int64_t *end) {
    int64_t tiles = (rows + DS4N_TILE_ROWS - 1) / DS4N_TILE_ROWS;
    *begin = tiles * ith / nth * DS4N_TILE_ROWS;
    *end = tiles * (ith + 1) / nth * DS4N_TILE_ROWS;
    if (*begin > rows) *begin = rows;
    if (*end > rows) *end = rows;
}

/* xsum[b] = Σ x[32b .. 32b+32), summed in order (the small-batch path must match it). */
static void block_sums(const float *x, int64_t nb, float *xsum) {
    for (int64_t b = 0; b < nb; b++) {
        float s = 0.0f;
        for (int j = 0; j < QK; j++) s += x[b * QK + j];
        xsum[b] = s;
    }
}

/* How many rows ahead make PREFETCH_BYTES, for rows of at most PREFETCH_ROW_MAX (0: none). */
static int64_t rows_ahead(int64_t row_bytes) {
    return row_bytes <= PREFETCH_ROW_MAX ? (PREFETCH_BYTES + row_bytes - 1) / row_bytes : 0;
}

/* The hardware prefetchers follow long sequential streams, but a small model's matrices
 * give each worker a few hundred short rows in DS4N_MV_ROWS streams: the decode paths also
 * fetch each stream's row PREFETCH_BYTES ahead by hand. Long rows are left to the hardware:
 * a burst of prefetches per row measured slower there; so is every row on a level whose set
 * says so (hw_prefetch: AVX2 on Zen 3 and AVX-512 on Zen 4, where the prefetches measured
 * slower at every row length).
 * Returns how many rows ahead (0: none). */
static int64_t prefetch_rows(int64_t row_bytes) {
    return ds4n_active_hw_prefetch() ? 0 : rows_ahead(row_bytes);
}

/* The same for the integer path: the super-block types as prefetch_rows says; the block
 * formats (Q8_0, Q4_0, Q4_1) fetch rows of at most PREFETCH_ROW_MAX by hand on every level,
 * one row at a time, since their rows kernel measured slower on such rows (Zen 4, AVX-512:
 * int2 Q4_1 576 x 1536, 960-byte rows, 0.75-0.92x). */
static int64_t int_prefetch_rows(int sb, int64_t row_bytes) {
    return sb ? prefetch_rows(row_bytes) : rows_ahead(row_bytes);
}

static int uses_rows_kernel(const struct ds4n_row_kernels *k, int64_t K) {
    return k->rows && K % QK == 0 && K / QK <= XSUM_MAX;
}

static void matvec_rows(const struct matmul_job *m, int64_t r0, int64_t r1) {
    const struct ds4n_type_traits *tt = ds4n_traits(m->type);
    const struct ds4n_row_kernels *k = ds4n_active_kernels(m->type);
    int64_t row_bytes = m->K / tt->block_size * tt->block_bytes;
    const uint8_t *w = (const uint8_t *)m->W + r0 * row_bytes;
    if (!uses_rows_kernel(k, m->K)) {
        for (int64_t r = r0; r < r1; r++, w += row_bytes) m->Y[r] = k->dot(w, m->X, m->K);
        return;
    }
    float xsum[XSUM_MAX];
    block_sums(m->X, m->K / QK, xsum);
    /* DS4N_MV_ROWS streams, each a contiguous run of rows: the kernel reads one row of each
     * per pass. Adjacent rows per pass measured slower: rows of a small model are a few
     * cache lines, and hopping between them defeats the hardware prefetcher; long runs
     * keep every stream sequential. */
    const int64_t n = r1 - r0;
    const int R = n < DS4N_MV_ROWS ? (int)n : DS4N_MV_ROWS;
    const int64_t len = n / R;
    float out[DS4N_MV_ROWS];
    const int64_t ahead = prefetch_rows(row_bytes);
    for (int64_t j = 0; j < len; j++) {
        if (ahead && j + ahead < len)
            for (int r = 0; r < R; r++) ds4n_prefetch_l1(w + (r * len + j + ahead) * row_bytes, row_bytes);
        k->rows(w + j * row_bytes, len * row_bytes, m->X, xsum, m->K, out, R);
        for (int r = 0; r < R; r++) m->Y[r0 + r * len + j] = out[r];
    }
    for (int64_t r = r0 + R * len; r < r1; r++)
        k->rows((const uint8_t *)m->W + r * row_bytes, row_bytes, m->X, xsum, m->K, m->Y + r, 1);
}

/* 2 <= T <= DS4N_SMALL_T (several sessions' decode steps in one call): each row is read
 * once and its blocks decoded once for all T tokens, and token t's result is bitwise the
 * T == 1 path's for it alone (the cols kernels repeat the rows or dot kernel's arithmetic
 * per token; rows land in the same worker share either way, and no kernel's result depends
 * on which rows share its pass). */
static void small_rows(const struct matmul_job *m, int64_t r0, int64_t r1) {
    const struct ds4n_type_traits *tt = ds4n_traits(m->type);
    const struct ds4n_row_kernels *k = ds4n_active_kernels(m->type);
    const int64_t row_bytes = m->K / tt->block_size * tt->block_bytes;
    const int rows_kernel = uses_rows_kernel(k, m->K);
    const int64_t nb = m->K / QK;
    /* Token by token when there is no kernel to share the decoding, or the T sums of a
     * rows-kernel type do not fit the stack buffer. */
    if (!k->cols || (k->rows && !rows_kernel) || (rows_kernel && nb * m->T > XSUM_MAX)) {
        for (int64_t t = 0; t < m->T; t++) {
            struct matmul_job one = *m;
            one.T = 1, one.X = m->X + t * m->K, one.Y = m->Y + t * m->rows;
            matvec_rows(&one, r0, r1);
        }
        return;
    }
    /* Token-major, then the same sums block-major (see ds4n_cols_fn), then slack for a
     * vector read of 8 from the last block's. */
    float xsum[2 * XSUM_MAX + 8];
    if (rows_kernel) {
        for (int64_t t = 0; t < m->T; t++) block_sums(m->X + t * m->K, nb, xsum + t * nb);
        float *by_block = xsum + m->T * nb;
        for (int64_t b = 0; b < nb; b++)
            for (int64_t t = 0; t < m->T; t++) by_block[b * m->T + t] = xsum[t * nb + b];
        memset(by_block + nb * m->T, 0, 8 * sizeof(float));
    }
    /* Tiles of DS4N_MV_ROWS rows, one from each of that many runs, as matvec_rows reads them:
     * memory sees that many sequential streams, not one (a single stream leaves most of the
     * bandwidth idle). */
    const int64_t n = r1 - r0;
    const int R = n < DS4N_MV_ROWS ? (int)n : DS4N_MV_ROWS;
    const int64_t len = n / R, T = m->T;
    const uint8_t *w = (const uint8_t *)m->W + r0 * row_bytes;
    float out[DS4N_SMALL_T * DS4N_MV_ROWS];
    const int64_t ahead = prefetch_rows(row_bytes);
    for (int64_t j = 0; j < len; j++) {
        if (ahead && j + ahead < len)
            for (int r = 0; r < R; r++) ds4n_prefetch_l1(w + (r * len + j + ahead) * row_bytes, row_bytes);
        k->cols(w + j * row_bytes, len * row_bytes, m->X, m->K, xsum, m->K, out, DS4N_MV_ROWS, R,
                (int)T);
        for (int64_t t = 0; t < T; t++)
            for (int r = 0; r < R; r++) m->Y[t * m->rows + r0 + r * len + j] = out[t * DS4N_MV_ROWS + r];
    }
    /* the rows past R whole runs: adjacent, one tile */
    const int64_t done = R * len;
    if (done < n) {
        k->cols(w + done * row_bytes, row_bytes, m->X, m->K, xsum, m->K, m->Y + r0 + done, m->rows,
                (int)(n - done), (int)T);
    }
}

/* The set's one kernel for decode and small batches (the AMX level's), when it has one for
 * the type and K: 1 if it ran. */
static int one_kernel(const struct matmul_job *m, int64_t r0, int64_t r1) {
    const struct ds4n_type_traits *tt = ds4n_traits(m->type);
    const struct ds4n_row_kernels *k = ds4n_active_kernels(m->type);
    const int64_t row_bytes = m->K / tt->block_size * tt->block_bytes;
    return k->mv && k->mv((const uint8_t *)m->W + r0 * row_bytes, row_bytes, r1 - r0, m->X,
                          m->K, (int)m->T, m->Y + r0, m->rows);
}

static void gemm_rows(const struct matmul_job *m, int64_t r0, int64_t r1) {
    const struct ds4n_type_traits *tt = ds4n_traits(m->type);
    ds4n_dequant_fn dequantize = ds4n_active_kernels(m->type)->dequantize;
    ds4n_tile_fn tile = ds4n_active_tile();
    const int cols = ds4n_active_tile_cols();
    int64_t row_bytes = m->K / tt->block_size * tt->block_bytes;
    _Alignas(64) float panel[PANEL_ROWS * PANEL_K];

    for (int64_t k0 = 0; k0 < m->K; k0 += PANEL_K) {
        int64_t kc = m->K - k0 < PANEL_K ? m->K - k0 : PANEL_K;
        const uint8_t *wk = (const uint8_t *)m->W + k0 / tt->block_size * tt->block_bytes;
        for (int64_t rp = r0; rp < r1; rp += PANEL_ROWS) {
            int64_t nr = r1 - rp < PANEL_ROWS ? r1 - rp : PANEL_ROWS;
            for (int64_t i = 0; i < nr; i++)
                dequantize(wk + (rp + i) * row_bytes, panel + i * kc, kc);
            for (int64_t t = 0; t < m->T; t += cols) {
                int nt = m->T - t < cols ? (int)(m->T - t) : cols;
                const float *x = m->X + t * m->K + k0;
                float *y = m->Y + t * m->rows + rp;
                for (int64_t i = 0; i < nr; i += DS4N_TILE_ROWS) {
                    int R = nr - i < DS4N_TILE_ROWS ? (int)(nr - i) : DS4N_TILE_ROWS;
                    tile(panel + i * kc, kc, x, m->K, kc, y + i, m->rows, R, nt, k0 > 0);
                }
            }
        }
    }
}

/* ---- the integer-activation path (ds4n_pool_set_precision; quants_int.h) ------------------ */

#define INT_CHUNK 64 /* tokens quantized at a time: their limbs stay in L2 for every row */
#ifndef INT_TILE_T
#define INT_TILE_T 4 /* tokens per prefill kernel call, block format: more spill the accumulators */
#endif
#ifndef INT_SLICE_G
/* Super-blocks per K slice of a super-block prefill tile: DS4N_SMALL_T tokens' 1024 int16
 * activations (16 KB) and PANEL_ROWS rows' codes (9 KB Q4_K) stay in L1 across the slice. */
#define INT_SLICE_G 4
#endif

/* This thread's buffer for quantized activations, grown on demand, freed at thread exit. */
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
struct scratch { void *p; size_t n; };
static void scratch_free(void *s) {
    free(((struct scratch *)s)->p);
    free(s);
}
static void scratch_key_init(void) {
    if (pthread_key_create(&scratch_key, scratch_free) != 0) scratch_key = 0;
}
static void *scratch(size_t bytes) {
    pthread_once(&scratch_once, scratch_key_init);
    struct scratch *s = pthread_getspecific(scratch_key);
    if (!s) {
        if (!(s = calloc(1, sizeof *s))) return NULL;
        if (pthread_setspecific(scratch_key, s) != 0) {
            free(s);
            return NULL;
        }
    }
    if (s->n < bytes) {
        free(s->p);
        s->n = 0;
        if (!(s->p = aligned_alloc(64, (bytes + 63) & ~(size_t)63))) return NULL;
        s->n = bytes;
    }
    return s->p;
}

/* Prefill of the super-block types (Q4_K, Q6_K): tiles of PANEL_ROWS rows x DS4N_SMALL_T
 * tokens, each walked over K in slices of INT_SLICE_G super-blocks so that the slice's
 * activations and codes stay in L1 while every row of the panel passes over them; each
 * row's codes are unpacked once per slice for all the tile's tokens. The accumulators carry
 * across slices (ds4n_sb_part_fn), so every y is bitwise the one-call kernel's. */
static void sb_tiles(const struct matmul_job *m, const struct ds4n_xq *xq, int64_t tc,
                     int64_t r0, int64_t r1, float *Y) {
    const ds4n_sb_part_fn part = ds4n_active_sb_part(m->type);
    const int64_t ng = m->K / DS4N_INT_GROUP;
    const struct ds4n_type_traits *tt = ds4n_traits(m->type);
    const int64_t row_bytes = m->K / tt->block_size * tt->block_bytes;
    _Alignas(64) float acc[PANEL_ROWS][DS4N_SMALL_T * 16];
    for (int64_t rp = r0; rp < r1; rp += PANEL_ROWS) {
        const int64_t nr = r1 - rp < PANEL_ROWS ? r1 - rp : PANEL_ROWS;
        const uint8_t *W = (const uint8_t *)m->W + rp * row_bytes;
        for (int64_t t = 0; t < tc; t += DS4N_SMALL_T) {
            const int nt = tc - t < DS4N_SMALL_T ? (int)(tc - t) : DS4N_SMALL_T;
            for (int64_t g0 = 0; g0 < ng; g0 += INT_SLICE_G) {
                const int64_t g1 = ng - g0 < INT_SLICE_G ? ng : g0 + INT_SLICE_G;
                for (int64_t i = 0; i < nr; i++) /* the last slice writes y */
                    part(W + i * row_bytes, xq, g0, g1, t, nt, acc[i],
                         g1 == ng ? Y + t * m->rows + rp + i : NULL, m->rows);
            }
        }
    }
}

/* Prefill of the super-block types on a level with a tile kernel (ds4n_sb_tile_fn): each
 * panel of PANEL_ROWS rows is unpacked once per chunk (INT_TILE_CHUNK tokens) into the panel
 * buffer (int16, L2-resident: 16 rows of K 8960 are 280 KB), then walked in tiles of
 * DS4N_SB_TILE_C tokens; for each, K in slices of INT_TILE_SLICE super-blocks (the tokens'
 * activations of a slice stay in L1 while every row pair of the panel passes), rows
 * DS4N_SB_TILE_R at a time. */
#ifndef INT_TILE_SLICE
#define INT_TILE_SLICE 8
#endif
/* Tokens quantized at a time on the tile path: a panel is unpacked once per chunk, and every
 * panel reads the whole chunk's activations, so a chunk is as many tokens as keep those in
 * L2 (INT_TILE_BYTES of int16), from INT_CHUNK up to INT_TILE_CHUNK (the engine's prefill
 * chunk): 256 tokens at K 2048, 64 at K 8192. */
#ifndef INT_TILE_CHUNK
#define INT_TILE_CHUNK 256
#endif
#ifndef INT_TILE_BYTES
#define INT_TILE_BYTES (1 << 20)
#endif
static int64_t tile_chunk(int64_t K, int limbs) {
    const int64_t fit = INT_TILE_BYTES / (2 * (limbs - 1) * K) / DS4N_SB_TILE_C * DS4N_SB_TILE_C;
    return fit < INT_CHUNK ? INT_CHUNK : fit > INT_TILE_CHUNK ? INT_TILE_CHUNK : fit;
}
static void sb_panels(const struct matmul_job *m, const struct ds4n_xq *xq, int64_t tc,
                      int64_t r0, int64_t r1, float *Y, struct ds4n_sb_panel *panel) {
    const ds4n_sb_tile_fn tile = ds4n_active_sb_tile();
    const ds4n_sb_unpack_fn unpack = ds4n_active_sb_unpack();
    const int64_t ng = m->K / DS4N_INT_GROUP;
    const struct ds4n_type_traits *tt = ds4n_traits(m->type);
    const int64_t row_bytes = m->K / tt->block_size * tt->block_bytes;
    _Alignas(64) float acc[(PANEL_ROWS + DS4N_SB_TILE_R - 1) / DS4N_SB_TILE_R]
                          [DS4N_SB_TILE_R * DS4N_SB_TILE_C * 16];
    for (int64_t rp = r0; rp < r1; rp += PANEL_ROWS) {
        const int64_t nr = r1 - rp < PANEL_ROWS ? r1 - rp : PANEL_ROWS;
        for (int64_t i = 0; i < nr; i++)
            unpack(m->type, (const uint8_t *)m->W + (rp + i) * row_bytes, panel, i);
        for (int64_t t = 0; t < tc; t += DS4N_SB_TILE_C) {
            const int C = tc - t < DS4N_SB_TILE_C ? (int)(tc - t) : DS4N_SB_TILE_C;
            for (int64_t g0 = 0; g0 < ng; g0 += INT_TILE_SLICE) {
                const int64_t g1 = ng - g0 < INT_TILE_SLICE ? ng : g0 + INT_TILE_SLICE;
                for (int64_t i = 0; i < nr; i += DS4N_SB_TILE_R) {
                    const int R = nr - i < DS4N_SB_TILE_R ? (int)(nr - i) : DS4N_SB_TILE_R;
                    tile(m->type, panel, i, R, xq, t, C, g0, g1, acc[i / DS4N_SB_TILE_R],
                         g1 == ng ? Y + t * m->rows + rp + i : NULL, m->rows);
                }
            }
        }
    }
}

/* Decode (T = 1) on the integer path with the level's rows kernel, for rows the hardware
 * prefetchers fetch (prefetch_rows 0: longer than PREFETCH_ROW_MAX, or any row on a
 * hw_prefetch level): DS4N_MV_ROWS streams, each a contiguous run of rows, read in step as
 * matvec_rows reads them. Row by row, a long row is one stream at a time: the down
 * projections (K 8192-8960) ran at 9 GB/s a core that way against 13-14 in step
 * (scripts/figures/decode_matvecs.c). Short rows on a level that prefetches by hand (NEON,
 * scalar) stay row by row with their prefetch, which measured 8-10% faster than a burst of
 * prefetches for four rows at once (AVX-512, before it left rows to the hardware); on AVX2
 * the 1.5B's 864-byte Q4_K rows ran 1.08-1.09x in step without prefetch than row by row
 * with it, and 1.10x on AVX-512 (Zen 4).
 * Each y is bitwise the one-row kernel's (the rows kernel's contract). */
static void int_decode_rows(const struct matmul_job *m, ds4n_int_rows_fn rows,
                            const struct ds4n_xq *xq, int64_t r0, int64_t r1) {
    const struct ds4n_type_traits *tt = ds4n_traits(m->type);
    const int64_t row_bytes = m->K / tt->block_size * tt->block_bytes;
    const uint8_t *w = (const uint8_t *)m->W + r0 * row_bytes;
    const int64_t n = r1 - r0;
    const int R = n < DS4N_MV_ROWS ? (int)n : DS4N_MV_ROWS;
    const int64_t len = n / R;
    float out[DS4N_MV_ROWS];
    for (int64_t j = 0; j < len; j++) {
        rows(w + j * row_bytes, len * row_bytes, xq, out, R);
        for (int r = 0; r < R; r++) m->Y[r0 + r * len + j] = out[r];
    }
    for (int64_t r = r0 + R * len; r < r1; r++)
        rows((const uint8_t *)m->W + r * row_bytes, row_bytes, xq, m->Y + r, 1);
}

/* Rows [r0, r1) on the integer path: 1 when it ran, 0 when it cannot (no buffer) and the float
 * path must. Each worker splits the activations itself (a few microseconds next to its rows).
 * Up to DS4N_SMALL_T tokens (decode, batched decode): rows from DS4N_MV_ROWS runs in turn with
 * the decode prefetch, as matvec_rows reads them. More (prefill): panels of PANEL_ROWS rows,
 * each row's codes unpacked once per DS4N_SMALL_T tokens, the panel L1/L2-resident across
 * them. Every token's result is the same whatever the grouping (the kernels' contract). */
static int int_rows(const struct matmul_job *m, ds4n_int_fn kern, int limbs, int64_t r0,
                    int64_t r1) {
    const struct ds4n_type_traits *tt = ds4n_traits(m->type);
    const int64_t row_bytes = m->K / tt->block_size * tt->block_bytes;
    const int sb = ds4n_int_type_sb(m->type);
    /* The super-block types' prefill tiles need a panel buffer beside the activations. */
    const int tiled = sb && m->T > DS4N_SMALL_T && ds4n_active_sb_tile();
    const int64_t cap = tiled ? tile_chunk(m->K, limbs) : INT_CHUNK;
    const int64_t chunk = m->T < cap ? m->T : cap;
    const size_t xq_bytes = (ds4n_xq_bytes(limbs, sb, m->K, chunk) + 63) & ~(size_t)63;
    const int64_t ng = m->K / DS4N_INT_GROUP;
    uint8_t *buf = scratch(xq_bytes + (tiled ? ds4n_sb_panel_bytes(PANEL_ROWS, ng) : 0));
    if (!buf) return 0;
    struct ds4n_sb_panel panel;
    if (tiled) ds4n_sb_panel_init(&panel, buf + xq_bytes, PANEL_ROWS, ng);
    const uint8_t *W = m->W;
    struct ds4n_xq xq;
    for (int64_t t0 = 0; t0 < m->T; t0 += chunk) {
        const int64_t tc = m->T - t0 < chunk ? m->T - t0 : chunk;
        ds4n_xq_init(&xq, buf, limbs, sb, m->K, tc);
        ds4n_xq_quantize(&xq, m->X + t0 * m->K, 0, tc);
        float *Y = m->Y + t0 * m->rows;
        const int64_t ahead = int_prefetch_rows(sb, row_bytes);
        const ds4n_int_rows_fn rows = m->T == 1 && !ahead ? ds4n_active_int_rows(m->type) : NULL;
        if (rows) {
            int_decode_rows(m, rows, &xq, r0, r1);
            continue;
        }
        if (tc <= DS4N_SMALL_T) {
            const int64_t n = r1 - r0, streams = n < DS4N_MV_ROWS ? n : DS4N_MV_ROWS;
            const int64_t len = n / streams;
            for (int64_t j = 0; j < len; j++)
                for (int64_t s = 0; s < streams; s++) {
                    const int64_t r = r0 + s * len + j;
                    if (ahead && j + ahead < len) ds4n_prefetch_l1(W + (r + ahead) * row_bytes, row_bytes);
                    kern(W + r * row_bytes, &xq, 0, (int)tc, Y + r, m->rows);
                }
            for (int64_t r = r0 + streams * len; r < r1; r++)
                kern(W + r * row_bytes, &xq, 0, (int)tc, Y + r, m->rows);
            continue;
        }
        if (tiled) {
            sb_panels(m, &xq, tc, r0, r1, Y, &panel);
            continue;
        }
        if (sb) {
            sb_tiles(m, &xq, tc, r0, r1, Y);
            continue;
        }
        for (int64_t rp = r0; rp < r1; rp += PANEL_ROWS) {
            const int64_t re = r1 - rp < PANEL_ROWS ? r1 : rp + PANEL_ROWS;
            for (int64_t t = 0; t < tc; t += INT_TILE_T) {
                const int nt = tc - t < INT_TILE_T ? (int)(tc - t) : INT_TILE_T;
                for (int64_t r = rp; r < re; r++)
                    kern(W + r * row_bytes, &xq, t, nt, Y + t * m->rows + r, m->rows);
            }
        }
    }
    return 1;
}

/* The integer kernel for this call, or NULL (exact precision, or no kernel for the type). */
static ds4n_int_fn int_kernel(const struct matmul_job *m, int *limbs) {
    *limbs = ds4n_thread_limbs();
    if (!*limbs || m->K % (ds4n_int_type_sb(m->type) ? DS4N_INT_GROUP : QK) != 0) return NULL;
    return ds4n_active_int_kernel(m->type);
}

void ds4n_matmul_part(int type, const void *W, int64_t rows, int64_t K, const float *X, int64_t T,
                      float *Y, int ith, int nth) {
    if (!ds4n_traits(type) || rows <= 0 || T <= 0) return;
    struct matmul_job m = {type, W, rows, K, T, X, Y};
    int64_t r0, r1;
    share(rows, ith, nth, &r0, &r1);
    const int64_t t0 = ds4n_profile_on() ? ds4n_now_ns() : 0;
    int limbs;
    const ds4n_int_fn kern = int_kernel(&m, &limbs);
    if (r0 < r1 && kern && int_rows(&m, kern, limbs, r0, r1)) {
        /* done on the integer path */
    } else if (r0 < r1 && !(T <= DS4N_SMALL_T && one_kernel(&m, r0, r1))) {
        if (T == 1) matvec_rows(&m, r0, r1);
        else if (T <= DS4N_SMALL_T) small_rows(&m, r0, r1);
        else gemm_rows(&m, r0, r1);
    }
    if (t0) ds4n_profile_matmul(type, rows, K, T, ds4n_now_ns() - t0);
}

static void matmul_task(void *ctx, int ith, int nth) {
    const struct matmul_job *m = ctx;
    ds4n_matmul_part(m->type, m->W, m->rows, m->K, m->X, m->T, m->Y, ith, nth);
}

void ds4n_matmul(ds4n_pool *pool, int type, const void *W, int64_t rows, int64_t K,
                 const float *X, int64_t T, float *Y) {
    struct matmul_job m = {type, W, rows, K, T, X, Y};
    ds4n_pool_run(pool, matmul_task, &m);
}
