/* The small-batch step's kernels (T = 2..8 tokens against one matrix: several sessions'
 * decode steps, or a verification chunk) as multiples of the single-token matvec, and, given
 * two builds of the library, B against A, all in one process: both libraries are loaded
 * (dlopen), and every round times T = 1, 2, 3, 4, 8 with A then B, on this thread's CPU time
 * (one thread, no pool). Each figure is the median over rounds of a ratio taken within one
 * round, so both sides of it ran under the same load on a shared machine. The weights are
 * COPIES distinct copies read in turn (1: one matrix, warm in the caches, the kernel's own
 * cost; more: as many as exceed the L3, as a model's layers stream from memory).
 *
 *   cc -O2 -o /tmp/small_batch_ab scripts/figures/small_batch_ab.c -ldl
 *   /tmp/small_batch_ab A/libds4n.so B/libds4n.so|- TYPE ROWS K SIMD COPIES ROUNDS [LIMBS [TS]]
 *   # e.g. native/build/libds4n.so - 3 576 576 1 1 41: Q4_1, the AVX2 level, one copy
 *
 * LIMBS (0 exact, the default; 2 int2, 3 int3) runs the matmuls on a one-thread pool set to
 * that precision (the pool runs a one-thread job on the caller, so the CPU time is still this
 * thread's); TS replaces the token counts 1,2,3,4,8 (comma-separated, the first 1, at most 64).
 *
 * TYPE is GGML's number (Q4_1 3, Q8_0 8), SIMD a ds4n_set_simd level (0 scalar, 1 AVX2,
 * 3 AVX-512). It checks every token's row against its T = 1 result (bitwise), and the two
 * builds against each other, and says so when they differ. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "figure_util.h"

typedef void (*matmul_fn)(void *, int, const void *, int64_t, int64_t, const float *, int64_t,
                          float *);
typedef int64_t (*type_fn)(int);
typedef int (*simd_fn)(int);

enum { MAX_N_T = 8, MAX_T = 64 };
static int N_T = 5, Ts[MAX_N_T] = {1, 2, 3, 4, 8};
typedef void *(*pool_new_fn)(int);
typedef int (*set_precision_fn)(void *, int);

static matmul_fn load(const char *path, int simd, void **lib) {
    *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!*lib) {
        fprintf(stderr, "%s\n", dlerror());
        exit(1);
    }
    if (((simd_fn)dlsym(*lib, "ds4n_set_simd"))(simd) != simd) {
        fprintf(stderr, "%s: SIMD level %d is not available here\n", path, simd);
        exit(2);
    }
    return (matmul_fn)dlsym(*lib, "ds4n_matmul");
}

/* One pass over every copy at T tokens: seconds per matmul. */
static double timed(matmul_fn mm, void *pool, int type, void **W, int copies, int64_t rows,
                    int64_t K, const float *X, int T, float *Y) {
    const double t0 = fig_now(1);
    for (int c = 0; c < copies; c++) mm(pool, type, W[c], rows, K, X, T, Y);
    return (fig_now(1) - t0) / copies;
}

int main(int argc, char **argv) {
    if (argc < 9 || argc > 11) {
        fprintf(stderr, "usage: small_batch_ab A.so B.so|- TYPE ROWS K SIMD COPIES ROUNDS [LIMBS [TS]]\n");
        return 2;
    }
    const int limbs = argc > 9 ? atoi(argv[9]) : 0;
    if (argc > 10) {
        N_T = 0;
        for (char *p = argv[10]; *p && N_T < MAX_N_T; p += *p == ',') {
            Ts[N_T++] = (int)strtol(p, &p, 10);
            if (Ts[N_T - 1] < 1 || Ts[N_T - 1] > MAX_T || Ts[0] != 1 || (*p && *p != ',')) {
                fprintf(stderr, "bad TS: 1 first, each 1..%d\n", MAX_T);
                return 2;
            }
        }
    }
    const int two = strcmp(argv[2], "-") != 0, nlib = two ? 2 : 1;
    const int type = atoi(argv[3]), simd = atoi(argv[6]), copies = atoi(argv[7]);
    const int64_t rows = atoll(argv[4]), K = atoll(argv[5]);
    const int rounds = atoi(argv[8]);
    void *lib[2];
    matmul_fn mm[2];
    void *pool[2] = {NULL, NULL};
    for (int l = 0; l < nlib; l++) {
        mm[l] = load(argv[1 + l], simd, &lib[l]);
        if (limbs) {
            pool[l] = ((pool_new_fn)dlsym(lib[l], "ds4n_pool_new"))(1);
            if (((set_precision_fn)dlsym(lib[l], "ds4n_pool_set_precision"))(pool[l], limbs) < 0) {
                fprintf(stderr, "bad limbs %d\n", limbs);
                return 2;
            }
        }
    }
    const int64_t block_bytes = ((type_fn)dlsym(lib[0], "ds4n_type_block_bytes"))(type);
    const int64_t block_size = ((type_fn)dlsym(lib[0], "ds4n_type_block_size"))(type);
    if (block_bytes <= 0 || K % block_size != 0 || rows < 1 || rounds < 1 || copies < 1) {
        fprintf(stderr, "bad type, K, rows, copies or rounds\n");
        return 2;
    }
    const int64_t bytes = rows * (K / block_size * block_bytes);
    void **W = malloc(sizeof *W * (size_t)copies);
    for (int c = 0; c < copies; c++) W[c] = fig_weights(type, bytes, block_bytes);
    float *X = malloc(sizeof(float) * MAX_T * (size_t)K);
    for (int64_t i = 0; i < MAX_T * K; i++) X[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    float *Y[2][MAX_N_T];
    for (int l = 0; l < nlib; l++)
        for (int i = 0; i < N_T; i++) Y[l][i] = calloc((size_t)(MAX_T * rows), sizeof(float));

    /* t[l][i][round], the ratios within each round */
    double *t[2][MAX_N_T], *vs1[2][MAX_N_T], *ba[MAX_N_T];
    for (int i = 0; i < N_T; i++) {
        ba[i] = malloc(sizeof(double) * (size_t)rounds);
        for (int l = 0; l < nlib; l++) {
            t[l][i] = malloc(sizeof(double) * (size_t)rounds);
            vs1[l][i] = malloc(sizeof(double) * (size_t)rounds);
        }
    }
    for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < N_T; i++)
            for (int l = 0; l < nlib; l++) {
                /* ABBA within the round: neither build always runs first */
                const int ll = (r + i) % 2 && two ? 1 - l : l;
                t[ll][i][r] = timed(mm[ll], pool[ll], type, W, copies, rows, K, X, Ts[i], Y[ll][i]);
            }
        for (int i = 0; i < N_T; i++) {
            for (int l = 0; l < nlib; l++) vs1[l][i][r] = t[l][i][r] / t[l][0][r];
            if (two) ba[i][r] = t[1][i][r] / t[0][i][r];
        }
    }
    /* every token bitwise its T = 1 result (with T = 1 run on each token alone), both builds alike */
    int differ = 0;
    for (int l = 0; l < nlib; l++)
        for (int tok = 0; tok < MAX_T; tok++) {
            float *one = malloc(sizeof(float) * (size_t)rows);
            mm[l](pool[l], type, W[copies - 1], rows, K, X + tok * K, 1, one);
            for (int i = 1; i < N_T; i++)
                if (tok < Ts[i] && memcmp(one, Y[l][i] + tok * rows, sizeof(float) * (size_t)rows))
                    differ = 1;
            free(one);
        }
    for (int i = 0; two && i < N_T; i++)
        if (memcmp(Y[0][i], Y[1][i], sizeof(float) * (size_t)(Ts[i] * rows))) differ = 1;
    if (differ) printf("THE RESULTS DIFFER\n");

    printf("type %d %lldx%lld simd %d copies %d rounds %d limbs %d\n", type, (long long)rows,
           (long long)K, simd, copies, rounds, limbs);
    for (int l = 0; l < nlib; l++) {
        const double one = fig_median(t[l][0], rounds);
        printf("  %s: T=1 %.1f us (%.2f ns/block); T=", l ? "B" : "A", one * 1e6,
               one * 1e9 / ((double)rows * (double)K / 32));
        for (int i = 1; i < N_T; i++) printf("%s%d", i > 1 ? "," : "", Ts[i]);
        printf(" / T=1:");
        for (int i = 1; i < N_T; i++) printf(" %.2f", fig_median(vs1[l][i], rounds));
        printf("\n");
    }
    if (two) {
        printf("  B / A time at T=");
        for (int i = 0; i < N_T; i++) printf("%s%d", i ? "," : "", Ts[i]);
        printf(":");
        for (int i = 0; i < N_T; i++) printf(" %.3f", fig_median(ba[i], rounds));
        printf("\n");
    }
    return 0;
}
