/* Checks every SIMD kernel set this CPU runs against the scalar one, for every type:
 * dequantize must be bit-identical, dot and matmul (decode and prefill shapes, 1 and 2
 * threads) equal within float32 rounding, and 2..8 tokens bitwise the single-token result;
 * the integer path (int2, int3) bitwise the scalar reference's (check_int).
 * Built natively (every x86 level the CPU runs: AVX2, AVX-512, AMX) and cross-compiled for
 * aarch64 and run under qemu (NEON) by `make -C native check-neon`. Exit status 1 on any
 * mismatch. Uses only the public ds4n.h API. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ds4n.h"

static const struct {
    const char *name;
    int type;
    int scale_offsets[2]; /* f16 scale fields in a block; -1: none (float types) */
} TYPES[] = {
    {"F32", DS4N_F32, {-1, -1}},      {"F16", DS4N_F16, {-1, -1}},
    {"BF16", DS4N_BF16, {-1, -1}},    {"Q4_0", DS4N_Q4_0, {0, -1}},
    {"Q4_1", DS4N_Q4_1, {0, 2}},      {"Q5_0", DS4N_Q5_0, {0, -1}},
    {"Q5_1", DS4N_Q5_1, {0, 2}},      {"Q8_0", DS4N_Q8_0, {0, -1}},
    {"Q2_K", DS4N_Q2_K, {80, 82}},    {"Q3_K", DS4N_Q3_K, {108, -1}},
    {"Q4_K", DS4N_Q4_K, {0, 2}},      {"Q5_K", DS4N_Q5_K, {0, 2}},
    {"Q6_K", DS4N_Q6_K, {208, -1}},   {"IQ2_XXS", DS4N_IQ2_XXS, {0, -1}},
    {"IQ4_NL", DS4N_IQ4_NL, {0, -1}}, {"IQ4_XS", DS4N_IQ4_XS, {0, -1}},
    {"MXFP4", DS4N_MXFP4, {-1, -1}}, /* its E8M0 scale byte is set in random_weights */
};

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}
static float rnd_float(void) { return ((float)(rnd() % 20001) - 10000.0f) / 10000.0f; }

/* An f16 of magnitude in [2^-9, 2^-5), random sign: a sane block scale. */
static uint16_t rnd_scale(void) {
    return (uint16_t)((rnd() & 0x8000) | ((6 + rnd() % 4) << 10) | (rnd() & 0x3ff));
}

/* rows x K weights of TYPES[i], random codes with sane scales. */
static uint8_t *random_weights(int i, int64_t rows, int64_t K, int64_t *row_bytes) {
    int type = TYPES[i].type;
    int64_t bs = ds4n_type_block_size(type), bb = ds4n_type_block_bytes(type);
    *row_bytes = K / bs * bb;
    int64_t blocks = rows * K / bs, bytes = rows * *row_bytes;
    uint8_t *w = malloc((size_t)bytes);
    for (int64_t j = 0; j < bytes; j++) w[j] = (uint8_t)rnd();
    for (int64_t b = 0; b < blocks; b++) {
        uint8_t *blk = w + b * bb;
        if (type == DS4N_F32) {
            float f = rnd_float();
            memcpy(blk, &f, 4);
        } else if (type == DS4N_F16) {
            uint16_t h = (uint16_t)((rnd() & 0x8000) | ((10 + rnd() % 8) << 10) | (rnd() & 0x3ff));
            memcpy(blk, &h, 2);
        } else if (type == DS4N_BF16) {
            uint16_t h = (uint16_t)((rnd() & 0x8000) | ((120 + rnd() % 8) << 7) | (rnd() & 0x7f));
            memcpy(blk, &h, 2);
        } else if (type == DS4N_MXFP4) {
            blk[0] = (uint8_t)(120 + rnd() % 8); /* a scale of 2^-8 .. 2^-1 */
        }
        for (int s = 0; s < 2; s++) {
            if (TYPES[i].scale_offsets[s] < 0) continue;
            uint16_t h = rnd_scale();
            memcpy(blk + TYPES[i].scale_offsets[s], &h, 2);
        }
    }
    return w;
}

static int failures;

static void fail(const char *what, const char *type, double got, double want) {
    printf("MISMATCH %s %s: %.9g vs scalar %.9g\n", what, type, got, want);
    failures++;
}

/* Σ|w||x| of a dequantized row: the scale float32 rounding errors are measured against. */
static double abs_dot(const float *w, const float *x, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += fabs((double)w[i] * x[i]);
    return s;
}

static void check_rows(int i, int simd) {
    enum { K = 1280, ROWS = 3 };
    int64_t row_bytes;
    uint8_t *w = random_weights(i, ROWS, K, &row_bytes);
    float x[K], scalar[K], fast[K];
    for (int k = 0; k < K; k++) x[k] = rnd_float();
    for (int r = 0; r < ROWS; r++) {
        const uint8_t *row = w + r * row_bytes;
        ds4n_set_simd(DS4N_SIMD_SCALAR);
        ds4n_dequantize(TYPES[i].type, row, scalar, K);
        float dot_scalar = ds4n_dot(TYPES[i].type, row, x, K);
        ds4n_set_simd(simd);
        ds4n_dequantize(TYPES[i].type, row, fast, K);
        float dot_fast = ds4n_dot(TYPES[i].type, row, x, K);
        for (int k = 0; k < K; k++)
            if (memcmp(&fast[k], &scalar[k], 4) != 0 && !(fast[k] == 0 && scalar[k] == 0)) {
                fail("dequantize", TYPES[i].name, fast[k], scalar[k]);
                break;
            }
        if (fabs((double)dot_fast - dot_scalar) > 2e-6 * abs_dot(scalar, x, K))
            fail("dot", TYPES[i].name, dot_fast, dot_scalar);
    }
    free(w);
}

static void check_matmul(int i, int simd, ds4n_pool *pool, int64_t K) {
    enum { ROWS = 13, TMAX = 17 };
    static const int64_t token_counts[] = {1, 2, 5, TMAX};
    int64_t row_bytes;
    uint8_t *w = random_weights(i, ROWS, K, &row_bytes);
    float *X = malloc(sizeof(float) * TMAX * K), *W = malloc(sizeof(float) * ROWS * K);
    float Ys[TMAX * ROWS], Yf[TMAX * ROWS];
    for (int64_t k = 0; k < TMAX * K; k++) X[k] = rnd_float();
    ds4n_set_simd(DS4N_SIMD_SCALAR);
    ds4n_dequantize(TYPES[i].type, w, W, ROWS * K);
    for (size_t c = 0; c < sizeof token_counts / sizeof *token_counts; c++) {
        int64_t T = token_counts[c];
        ds4n_set_simd(DS4N_SIMD_SCALAR);
        ds4n_matmul(NULL, TYPES[i].type, w, ROWS, K, X, T, Ys);
        ds4n_set_simd(simd);
        ds4n_matmul(pool, TYPES[i].type, w, ROWS, K, X, T, Yf);
        for (int64_t t = 0; t < T; t++)
            for (int64_t r = 0; r < ROWS; r++) {
                double tol = 3e-6 * abs_dot(W + r * K, X + t * K, K);
                if (fabs((double)Yf[t * ROWS + r] - Ys[t * ROWS + r]) > tol) {
                    const char *what = T == 1 ? "matvec" : "gemm";
                    fail(what, TYPES[i].name, Yf[t * ROWS + r], Ys[t * ROWS + r]);
                    t = T;
                    break;
                }
            }
    }
    free(X);
    free(W);
    free(w);
}

/* 2..8 tokens in one matmul (the small-batch path) must give each token the bits of a
 * single-token matmul, at the scalar level and this CPU's SIMD level, for `rows` rows (odd
 * counts give tiles of 1..4 rows and a tail). */
static void check_small_batch(int i, int simd, ds4n_pool *pool, int64_t K, int64_t rows) {
    enum { ROWS_MAX = 37, TMAX = 8 };
    int64_t row_bytes;
    uint8_t *w = random_weights(i, rows, K, &row_bytes);
    float *X = malloc(sizeof(float) * TMAX * K);
    float alone[TMAX * ROWS_MAX], batch[TMAX * ROWS_MAX];
    for (int64_t k = 0; k < TMAX * K; k++) X[k] = rnd_float();
    const int levels[2] = {DS4N_SIMD_SCALAR, simd};
    for (int l = 0; l < 2; l++) {
        ds4n_set_simd(levels[l]);
        for (int t = 0; t < TMAX; t++)
            ds4n_matmul(pool, TYPES[i].type, w, rows, K, X + t * K, 1, alone + t * rows);
        for (int64_t T = 2; T <= TMAX; T++) {
            ds4n_matmul(pool, TYPES[i].type, w, rows, K, X, T, batch);
            if (memcmp(batch, alone, sizeof(float) * (size_t)(T * rows)) != 0) {
                for (int64_t j = 0; j < T * rows; j++)
                    if (memcmp(&batch[j], &alone[j], 4) != 0) {
                        char what[64];
                        snprintf(what, sizeof what, "small batch (%s, T=%d, %d rows)",
                                 l ? "simd" : "scalar", (int)T, (int)rows);
                        fail(what, TYPES[i].name, batch[j], alone[j]);
                        break;
                    }
                break;
            }
        }
    }
    free(X);
    free(w);
}

/* The integer path (precision int2, int3: limbs 2, 3) of the types with integer kernels: the
 * level's kernels must give bitwise the scalar reference's results (quants_int.h defines the
 * arithmetic once, lane for lane) in every shape the engine runs: decode row by row and in
 * the 4-row long-row kernels (rows over 1 KB) with their tails of 1..3 rows, batched decode
 * (every T of 1..8), and prefill (the part kernels' slices and the tile kernels' 2 x 4 tiles,
 * with remainders of rows and tokens; 260 tokens: more than a tile chunk). K: a part group at
 * a row's end (a lone block, three blocks) for the 32-value types, a part slice for the
 * K-quants. Outliers in the activations, as residual streams have, so the scales differ. */
/* The super-block format's extremes (extremes = 1): activations x = v / 2^14 with each 256-value
 * group's first |v| just under 2^15, so the group's scale is 2^-14 and every other value's
 * limb 0 is v rounded (limb 1, with three limbs, v's fraction times 2^7): the clamp's ±32767,
 * the values whose low byte is 0x80 or 0xff (where a split into two signed bytes, or a high
 * byte taken as (a + 128) / 256, would leave int8), 0, ±1, ±255, ±256 and random ones; and
 * weights at their extremes in the first rows: Q4_K's codes 15 under the scales and mins 63,
 * Q6_K's codes 63 under the scale -128, codes 0 (weight -32) under 127, codes 63 under 127:
 * every bound of the byte split's VPMADDUBSW pair sums (quants_int_avx2.c) is reached. No |v|
 * reaches 2^15: the group's scale would double, and its values halve. */
static const float SB_EXTREMES[] = {32767.99f, -32767.99f, 32767.0f, -32767.0f, 32640.0f,
                                    32639.6f, 32767.4f, -32640.0f, -32641.0f, -32513.0f,
                                    -32512.6f, 255.0f, 256.0f, -256.0f, -255.0f,
                                    -1.0f, 1.0f, 0.0f, 128.0f, -128.0f, -129.0f, 127.5f,
                                    16383.7f, -16384.3f, 32000.25f, -31999.75f, 383.0f};

static void extreme_activations(float *X, int64_t n) {
    const int ne = (int)(sizeof SB_EXTREMES / sizeof *SB_EXTREMES);
    for (int64_t k = 0; k < n; k++) {
        float v;
        if (k % 256 == 0) v = (rnd() & 1) ? 32767.99f : -32767.99f;
        else if (rnd() % 4) v = SB_EXTREMES[rnd() % (uint32_t)ne];
        else v = (float)((int32_t)(rnd() % 65535) - 32767) + (float)(rnd() % 128) / 128.0f;
        X[k] = v * 0x1p-14f;
    }
}

static void extreme_weights(int type, uint8_t *w, int64_t rows, int64_t row_bytes) {
    const int64_t bb = ds4n_type_block_bytes(type);
    for (int64_t r = 0; r < rows && r < 3; r++)
        for (uint8_t *blk = w + r * row_bytes; blk < w + (r + 1) * row_bytes; blk += bb) {
            if (type == DS4N_Q4_K) { /* d, dmin, 12 scale bytes, 128 code bytes */
                memset(blk + 4, 0xff, 12 + 128);
                continue;
            }
            /* Q6_K: 128 low-nibble bytes, 64 high-bit bytes, 16 int8 scales, d */
            memset(blk, r == 1 ? 0x00 : 0xff, 128 + 64);
            memset(blk + 192, r == 0 ? 0x80 : 0x7f, 16);
        }
}

static void check_int(int i, int simd, ds4n_pool *pool, int64_t K, int64_t rows, int limbs,
                      int extremes) {
    enum { TMAX = 260 };
    static const int64_t token_counts[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 70, TMAX};
    int64_t row_bytes;
    uint8_t *w = random_weights(i, rows, K, &row_bytes);
    float *X = malloc(sizeof(float) * TMAX * (size_t)K);
    float *Ys = malloc(sizeof(float) * TMAX * (size_t)rows), *Yf = malloc(sizeof(float) * TMAX * (size_t)rows);
    if (extremes) {
        extreme_activations(X, TMAX * K);
        extreme_weights(TYPES[i].type, w, rows, row_bytes);
    } else {
        for (int64_t k = 0; k < TMAX * K; k++) X[k] = rnd_float() * (rnd() % 97 == 0 ? 40.0f : 1.0f);
    }
    ds4n_pool_set_precision(pool, limbs);
    for (size_t c = 0; c < sizeof token_counts / sizeof *token_counts; c++) {
        const int64_t T = token_counts[c];
        ds4n_set_simd(DS4N_SIMD_SCALAR);
        ds4n_matmul(pool, TYPES[i].type, w, rows, K, X, T, Ys);
        ds4n_set_simd(simd);
        ds4n_matmul(pool, TYPES[i].type, w, rows, K, X, T, Yf);
        for (int64_t j = 0; j < T * rows; j++)
            if (memcmp(&Yf[j], &Ys[j], 4) != 0) {
                char what[96];
                snprintf(what, sizeof what, "int%d%s (K %d, %d rows, T=%d, token %d row %d)", limbs,
                         extremes ? " extremes" : "", (int)K, (int)rows, (int)T, (int)(j / rows),
                         (int)(j % rows));
                fail(what, TYPES[i].name, Yf[j], Ys[j]);
                break;
            }
    }
    ds4n_pool_set_precision(pool, 0);
    free(Ys);
    free(Yf);
    free(X);
    free(w);
}

static int has_int_kernel(int type) {
    return type == DS4N_Q4_0 || type == DS4N_Q4_1 || type == DS4N_Q8_0 || type == DS4N_Q4_K ||
           type == DS4N_Q6_K;
}

/* MXFP4 blocks with every E8M0 scale byte (subnormal halves at 0 and 1, overflow at 255):
 * the SIMD dequantizer must be bit-identical to the scalar one there too. */
static void check_mxfp4_exponents(int simd) {
    enum { BLOCK = 17, VALUES = 32 };
    static uint8_t blocks[256 * BLOCK];
    static float scalar[256 * VALUES], fast[256 * VALUES];
    for (int e = 0; e < 256; e++) {
        blocks[e * BLOCK] = (uint8_t)e;
        for (int j = 1; j < BLOCK; j++) blocks[e * BLOCK + j] = (uint8_t)rnd();
    }
    ds4n_set_simd(DS4N_SIMD_SCALAR);
    ds4n_dequantize(DS4N_MXFP4, blocks, scalar, 256 * VALUES);
    ds4n_set_simd(simd);
    ds4n_dequantize(DS4N_MXFP4, blocks, fast, 256 * VALUES);
    for (int k = 0; k < 256 * VALUES; k++)
        if (memcmp(&fast[k], &scalar[k], 4) != 0 && !(fast[k] == 0 && scalar[k] == 0)) {
            fail("dequantize (every exponent)", "MXFP4", fast[k], scalar[k]);
            break;
        }
}

/* The peak probe (ds4n_mac_peak) of a level: f32 FMA for the exact path, wherever the level
 * has a tile of its own; the integer dot products where it has integer kernels (x86, NEON);
 * none on the scalar level. */
static void check_peak(int simd) {
    for (int limbs = 0; limbs <= 3; limbs += limbs ? 1 : 2)
        for (int t = 0; t < 2; t++) {
            const int type = t ? DS4N_Q4_K : DS4N_Q4_1, sb = t;
            ds4n_mac_peak_info info;
            if (ds4n_mac_peak(type, limbs, 2000, 1, &info) != 0) {
                printf("peak: level %d limbs %d type %d: refused\n", simd, limbs, type);
                failures++;
                continue;
            }
            const int want = simd != DS4N_SIMD_SCALAR;
            const int products = limbs == 0 ? 1 : sb ? limbs - 1 : limbs;
            const int got = info.instr != NULL && info.lane_rate > 0 && info.lane_rate < 1e15;
            /* NEON's block format: SDOT exactly where its SDOT kernels were chosen */
            if (simd == DS4N_SIMD_NEON && limbs && !sb && got &&
                (strncmp(info.instr, "SDOT", 4) == 0) !=
                    (strcmp(ds4n_int_kernel_set(), "neon+dotprod") == 0)) {
                printf("peak: %s probed under the %s kernels\n", info.instr, ds4n_int_kernel_set());
                failures++;
            }
            if (got != want || info.products != products ||
                (want && info.rate != info.lane_rate / products) || (!want && info.rate != 0)) {
                printf("peak: level %d limbs %d type %d: %s %g x %d\n", simd, limbs, type,
                       info.instr ? info.instr : "(none)", info.lane_rate, info.products);
                failures++;
            }
        }
    ds4n_mac_peak_info info;
    if (ds4n_mac_peak(DS4N_Q4_1, 1, 2000, 1, &info) != -1 ||
        ds4n_mac_peak(DS4N_Q4_1, 0, 0, 1, &info) != -1) {
        printf("peak: a bad argument accepted\n");
        failures++;
    }
}

/* argv[1] "int-block": the integer path's block-format types alone (Q4_0, Q4_1, Q8_0):
 * check-neon's second CPU, without SDOT, which changes only their kernels. */
int main(int argc, char **argv) {
    const int int_only = argc > 1 && strcmp(argv[1], "int-block") == 0;
    const char *names[] = {"scalar", "avx2", "neon", "avx512", "amx"};
    ds4n_pool *pool = ds4n_pool_new(2), *pool1 = ds4n_pool_new(1);
    const int n_types = (int)(sizeof TYPES / sizeof *TYPES);
    int checked = 0;
    /* Every SIMD level this CPU runs (ds4n_set_simd falls back to scalar for the others). */
    for (int simd = DS4N_SIMD_AVX2; simd <= DS4N_SIMD_AMX; simd++) {
        if (ds4n_set_simd(simd) != simd) continue;
        const int before = failures;
        /* Which integer kernels check_int compares (check-neon runs the aarch64 build on CPUs
         * with and without SDOT); every SIMD level has its own. */
        const char *int_set = ds4n_int_kernel_set();
        printf("check_kernels: %s: integer kernels %s\n", names[simd], int_set);
        if (strcmp(int_set, "scalar") == 0) fail("integer kernel set", names[simd], 0, 1);
        for (int i = 0; i < n_types && !int_only; i++) {
            check_rows(i, simd);
            check_matmul(i, simd, NULL, 512);
            check_matmul(i, simd, pool, 512);
            /* every tile shape: 1..4 rows a worker's share, tails of 1..3 */
            static const int64_t row_counts[] = {1, 2, 3, 5, 7, 13, 37};
            for (size_t c = 0; c < sizeof row_counts / sizeof *row_counts; c++) {
                check_small_batch(i, simd, NULL, 768, row_counts[c]);
                check_small_batch(i, simd, pool, 768, row_counts[c]);
            }
            /* An odd number of blocks (and rows fewer than a tile), for the 32-value types; and
             * rows long enough that 5..8 tokens of x outgrow L1 (the AVX2 tiles then take the
             * tokens in two halves), odd and even row counts. */
            if (ds4n_type_block_size(TYPES[i].type) <= 32) {
                check_matmul(i, simd, pool, 96);
                check_small_batch(i, simd, pool, 96, 13);
                check_small_batch(i, simd, NULL, 1536, 7);
                check_small_batch(i, simd, pool, 1536, 13);
            }
        }
        for (int i = 0; i < n_types; i++) {
            if (!has_int_kernel(TYPES[i].type)) continue;
            if (int_only && ds4n_type_block_size(TYPES[i].type) != 32) continue;
            static const int64_t k_block[] = {96, 576, 608, 1888}, k_super[] = {256, 1280, 2304};
            const int super = ds4n_type_block_size(TYPES[i].type) == 256;
            const int64_t *ks = super ? k_super : k_block;
            const int nk = super ? 3 : 4;
            static const int64_t row_counts[] = {1, 3, 19};
            for (int k = 0; k < nk; k++)
                for (size_t r = 0; r < sizeof row_counts / sizeof *row_counts; r++)
                    for (int limbs = 2; limbs <= 3; limbs++) {
                        check_int(i, simd, pool1, ks[k], row_counts[r], limbs, 0);
                        check_int(i, simd, pool, ks[k], row_counts[r], limbs, 0);
                        /* the extremes on the long rows only (decode's rows kernels, a
                         * part slice): check-neon runs this under qemu in make test */
                        if (super && k > 0 && row_counts[r] == 19)
                            check_int(i, simd, pool1, ks[k], row_counts[r], limbs, 1);
                    }
        }
        if (!int_only) check_mxfp4_exponents(simd);
        check_peak(simd); /* on the second CPU too: the probe follows its kernels' choice */
        printf("check_kernels: %s vs scalar, %d types%s: %s\n", names[simd], n_types,
               int_only ? " (integer path, block format only)" : "", failures > before ? "FAILED" : "ok");
        checked++;
    }
    ds4n_pool_free(pool);
    ds4n_pool_free(pool1);
    ds4n_set_simd(DS4N_SIMD_SCALAR);
    check_peak(DS4N_SIMD_SCALAR);
    ds4n_set_simd(DS4N_SIMD_AUTO);
    if (!checked) printf("check_kernels: this CPU has no SIMD kernel set; nothing to compare\n");
    return failures ? 1 : 0;
}
