/* CPU cost of a small-batch matmul (T = 2..8 tokens, the 2 <= T <= DS4N_SMALL_T path: several
 * sessions' decode steps, or a speculative verification chunk) against the single-token
 * decode matvec of the same matrix, on this thread's CPU time (best of 30 interleaved rounds:
 * other processes on the shared cores barely move it), one thread, random codes.
 *
 *   cc -O2 -Inative -o /tmp/small_batch_cost scripts/figures/small_batch_cost.c \
 *       -Lnative/build -lds4n -Wl,-rpath,$PWD/native/build
 *   /tmp/small_batch_cost TYPE ROWS K [SIMD]     e.g. 3 576 576 (Q4_1), 8 49152 576 (Q8_0)
 *
 * TYPE is a ds4n_type id (ds4n.h), SIMD a ds4n_set_simd level (1 AVX2, 3 AVX-512; default:
 * the best this CPU runs). Build it once against each library to compare two trees. Prints
 * T = 1's time per call and per 32-value block, then T = 2, 3, 4, 5, 8 as multiples of it. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ds4n.h"

static double cpu_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    const int type = argc > 1 ? atoi(argv[1]) : DS4N_Q4_1;
    const int64_t rows = argc > 2 ? atoll(argv[2]) : 576, K = argc > 3 ? atoll(argv[3]) : 576;
    ds4n_set_simd(argc > 4 ? atoi(argv[4]) : DS4N_SIMD_AUTO);
    const int64_t bs = ds4n_type_block_size(type), bb = ds4n_type_block_bytes(type);
    if (bs <= 0 || K % bs != 0 || rows <= 0) {
        fprintf(stderr, "type %d cannot take rows of %lld values\n", type, (long long)K);
        return 2;
    }
    const int64_t row_bytes = K / bs * bb, bytes = rows * row_bytes;
    uint8_t *w = malloc((size_t)bytes);
    float *X = malloc(sizeof(float) * 8 * (size_t)K), *Y = malloc(sizeof(float) * 8 * (size_t)rows);
    for (int64_t i = 0; i < bytes; i++) w[i] = (uint8_t)rand();
    const uint16_t scale = 0x2000; /* a sane f16 scale (and min) in every block */
    for (int64_t b = 0; b < bytes / bb && bs == 32; b++) {
        memcpy(w + b * bb, &scale, 2);
        if (type == DS4N_Q4_1 || type == DS4N_Q5_1) memcpy(w + b * bb + 2, &scale, 2);
    }
    for (int64_t i = 0; i < 8 * K; i++) X[i] = (float)(rand() % 2000 - 1000) / 1000.0f;
    enum { N_T = 6 };
    const int Ts[N_T] = {1, 2, 3, 4, 5, 8};
    double best[N_T];
    for (int i = 0; i < N_T; i++) best[i] = 1e30;
    const int calls = rows * K > 4000000 ? 2 : 50;
    for (int round = 0; round < 30; round++)
        for (int i = 0; i < N_T; i++) {
            const double t0 = cpu_seconds();
            for (int c = 0; c < calls; c++) ds4n_matmul(NULL, type, w, rows, K, X, Ts[i], Y);
            const double s = (cpu_seconds() - t0) / calls;
            if (s < best[i]) best[i] = s;
        }
    printf("type %d %lldx%lld  T=1 %.1f us (%.2f ns/block)  T=2,3,4,5,8 x", type, (long long)rows,
           (long long)K, best[0] * 1e6, best[0] * 1e9 / ((double)rows * (double)K / 32));
    for (int i = 1; i < N_T; i++) printf(" %.2f", best[i] / best[0]);
    printf("\n");
    free(w);
    free(X);
    free(Y);
    return 0;
}
