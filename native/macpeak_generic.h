/* The multiply-add peak of one core for one instruction (sequence), written once for every
 * vector ISA. Included by each level's file (macpeak_avx2.c, macpeak_avx512.c,
 * macpeak_neon.c) after it defines, for its vector type:
 *
 *   PEAK_REG        the asm constraint of a vector register ("v" on x86, "w" on aarch64)
 *
 * and then DS4N_PEAK_DEFINE(name, vec, zero, step, macs) defines double name(int64_t iters):
 * 12 independent chains acc = step(acc), each step one use of the instruction (sequence)
 * doing `macs` multiply-adds, iters times, timed in the thread's CPU time (the machine may
 * be shared: CPU time is what the core gave this thread); returns multiply-adds per second.
 *
 * Why 12 chains: the instructions measured have a latency of 3-5 cycles and issue up to two
 * per cycle, so fewer chains would time the latency, not the throughput (12 also fit AVX2's
 * 16 registers beside two constants). Each step takes its accumulator as an input (as the
 * FMA and VNNI forms do, or as an operand of the multiply where the idiom has no
 * accumulating form), and an empty asm makes every accumulator opaque once per round, so
 * the compiler can neither fold the steps nor hoist a product out of the loop. The values
 * computed do not matter: the arithmetic units take the same time for any input. */
#ifndef DS4N_MACPEAK_GENERIC_H
#define DS4N_MACPEAK_GENERIC_H

#include <stdint.h>
#include <time.h>

static inline double peak_cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define DS4N_PEAK_DEFINE(name, vec, zero, step, macs)                                          \
    double name(int64_t iters) {                                                               \
        vec a0 = zero, a1 = zero, a2 = zero, a3 = zero, a4 = zero, a5 = zero;                  \
        vec a6 = zero, a7 = zero, a8 = zero, a9 = zero, a10 = zero, a11 = zero;                \
        const double t0 = peak_cpu_seconds();                                                  \
        for (int64_t i = 0; i < iters; i++) {                                                  \
            a0 = step(a0), a1 = step(a1), a2 = step(a2), a3 = step(a3);                        \
            a4 = step(a4), a5 = step(a5), a6 = step(a6), a7 = step(a7);                        \
            a8 = step(a8), a9 = step(a9), a10 = step(a10), a11 = step(a11);                    \
            __asm__ volatile("" : "+" PEAK_REG(a0), "+" PEAK_REG(a1), "+" PEAK_REG(a2),        \
                             "+" PEAK_REG(a3), "+" PEAK_REG(a4), "+" PEAK_REG(a5),             \
                             "+" PEAK_REG(a6), "+" PEAK_REG(a7), "+" PEAK_REG(a8),             \
                             "+" PEAK_REG(a9), "+" PEAK_REG(a10), "+" PEAK_REG(a11));          \
        }                                                                                      \
        const double s = peak_cpu_seconds() - t0;                                              \
        /* The chains' last values leave through an asm too: nothing above is dead code. */    \
        __asm__ volatile("" ::PEAK_REG(a0), PEAK_REG(a1), PEAK_REG(a2), PEAK_REG(a3),          \
                         PEAK_REG(a4), PEAK_REG(a5), PEAK_REG(a6), PEAK_REG(a7),               \
                         PEAK_REG(a8), PEAK_REG(a9), PEAK_REG(a10), PEAK_REG(a11));            \
        return s > 0 ? 12.0 * (double)(macs) * (double)iters / s : 0.0;                        \
    }

#endif
