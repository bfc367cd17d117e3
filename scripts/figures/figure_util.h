/* What the C figure programs (matvec_ab.c, decode_ab.c, decode_matvecs.c, small_batch_ab.c)
 * share: their clock, medians, llama.cpp's layer rule for Q4_K_M, and random weights of a
 * quant type. Header-only: each program is one `cc` line (see its own comment). */
#ifndef DS4D_FIGURE_UTIL_H
#define DS4D_FIGURE_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

/* One thread: its CPU time (a shared machine's other work does not count); several: wall
 * time (the threads' CPU times would add up). */
static inline double fig_now(int threads) {
    struct timespec ts;
    clock_gettime(threads == 1 ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline int fig_cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Sorts v in place. Medians, not bests: a VM's CPU time now and then loses a slice of work
 * to steal accounting, and the best of many runs picks those. */
static inline double fig_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, fig_cmp_double);
    return v[n / 2];
}

/* llama.cpp's use_more_bits(i, n): the first and last eighth, and every third between. */
static inline int fig_more_bits(int i, int n) {
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

/* `bytes` of random codes of GGML type `type` (blocks of `block_bytes`) on huge pages, as a
 * model's weights are, with finite f16 scales (exponent 5..11: about 0.002 .. 0.06) where
 * the type keeps them: d (and the min, or the K-quants' dmin) lead the block, Q6_K's d ends
 * it. Random scales could be inf or NaN, and no kernel's speed should depend on that. */
static inline void *fig_weights(int type, int64_t bytes, int64_t block_bytes) {
    uint8_t *p = mmap(NULL, (size_t)bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                      -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    madvise(p, (size_t)bytes, MADV_HUGEPAGE);
    for (int64_t i = 0; i < bytes; i++) p[i] = (uint8_t)rand();
    const int off = type == 14 ? 208 : 0;                          /* Q6_K */
    const int two = type == 3 || type == 7 || type == 12 || type == 13; /* Q4_1 Q5_1 Q4_K Q5_K */
    for (int64_t b = 0; b < bytes / block_bytes; b++)
        for (int j = 0; j <= two; j++) {
            const uint16_t h = (uint16_t)(((5 + rand() % 7) << 10) | (rand() & 0x3ff));
            memcpy(p + b * block_bytes + off + 2 * j, &h, 2);
        }
    return p;
}

#endif
