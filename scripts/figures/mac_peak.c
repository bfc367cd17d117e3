/* The multiply-accumulate peak of one core, measured: 12 independent chains of one 512-bit
 * instruction (f32 FMA, int16 VPDPWSSD, int8 VPDPBUSD), in the thread's CPU time. Built and
 * run by scripts/figures/int_path_speed.py peak (needs AVX-512 VNNI); prints MAC/s of each. */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

#define ITERS 20000000L

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define CHAINS(op, type, init, b, c)                                                        \
    do {                                                                                    \
        type a0 = init, a1 = init, a2 = init, a3 = init, a4 = init, a5 = init;              \
        type a6 = init, a7 = init, a8 = init, a9 = init, a10 = init, a11 = init;            \
        for (long i = 0; i < ITERS; i++) {                                                  \
            a0 = op(a0, b, c), a1 = op(a1, b, c), a2 = op(a2, b, c), a3 = op(a3, b, c);     \
            a4 = op(a4, b, c), a5 = op(a5, b, c), a6 = op(a6, b, c), a7 = op(a7, b, c);     \
            a8 = op(a8, b, c), a9 = op(a9, b, c), a10 = op(a10, b, c), a11 = op(a11, b, c); \
            __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4),         \
                             "+v"(a5), "+v"(a6), "+v"(a7), "+v"(a8), "+v"(a9), "+v"(a10),   \
                             "+v"(a11));                                                    \
        }                                                                                   \
        sink = sink + (double)((float *)&a0)[0] + (double)((float *)&a11)[0];                \
    } while (0)

static double sink;

static __m512 fma_op(__m512 a, __m512 b, __m512 c) { return _mm512_fmadd_ps(b, c, a); }

int main(void) {
    const __m512 fb = _mm512_set1_ps(1.0f), fc = _mm512_set1_ps(1e-9f);
    const __m512i ib = _mm512_set1_epi16(1), ic = _mm512_set1_epi16(0);
    double t = now();
    CHAINS(fma_op, __m512, _mm512_setzero_ps(), fb, fc);
    printf("f32 FMA   %.1f G MAC/s\n", 12.0 * 16 * ITERS / (now() - t) / 1e9);
    t = now();
    CHAINS(_mm512_dpwssd_epi32, __m512i, _mm512_setzero_si512(), ib, ic);
    printf("VPDPWSSD  %.1f G MAC/s (int16)\n", 12.0 * 32 * ITERS / (now() - t) / 1e9);
    t = now();
    CHAINS(_mm512_dpbusd_epi32, __m512i, _mm512_setzero_si512(), ib, ic);
    printf("VPDPBUSD  %.1f G MAC/s (int8)\n", 12.0 * 64 * ITERS / (now() - t) / 1e9);
    return sink == 12345.0;
}
