/* The per-level peak probes (internal; the ABI is ds4n_mac_peak in ds4n.h): each returns the
 * multiply-adds per second of one core for iters rounds of 12 chains of its instruction
 * (macpeak_generic.h), only callable where its level's flags are supported. */
#ifndef DS4N_MACPEAK_H
#define DS4N_MACPEAK_H

#include <stdint.h>

typedef double (*ds4n_peak_fn)(int64_t iters);

#if defined(__x86_64__) || defined(_M_X64)
double ds4n_peak_avx2_fma(int64_t iters);
double ds4n_peak_avx2_madd(int64_t iters);
double ds4n_peak_avx2_maddubs(int64_t iters);
double ds4n_peak_avx512_fma(int64_t iters);
double ds4n_peak_avx512_dpwssd(int64_t iters);
double ds4n_peak_avx512_dpbusd(int64_t iters);
#endif
#if defined(__aarch64__)
double ds4n_peak_neon_fma(int64_t iters);
double ds4n_peak_neon_smlal(int64_t iters);
double ds4n_peak_neon_smull(int64_t iters);
double ds4n_peak_neon_sdot(int64_t iters); /* only where the CPU has SDOT */
#endif

#endif
