/* ds4n — the C half of ds4d: quantized kernels, thread pool, matmul.
 *
 * Loaded with ctypes by ds4d/engine/native.py; every symbol here is part of that ABI.
 * Model families (llama.h, ...) build their whole forward pass on these pieces, so one
 * prefill chunk or one decode token is one C call from Python.
 *
 * Quant types use GGML's numbering (GGUF tensor types), so a tensor's type field from the
 * file is passed through unchanged.
 */
#ifndef DS4N_H
#define DS4N_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum ds4n_type {
    DS4N_F32 = 0, DS4N_F16 = 1, DS4N_Q4_0 = 2, DS4N_Q4_1 = 3,
    DS4N_Q5_0 = 6, DS4N_Q5_1 = 7, DS4N_Q8_0 = 8,
    DS4N_Q2_K = 10, DS4N_Q3_K = 11, DS4N_Q4_K = 12, DS4N_Q5_K = 13, DS4N_Q6_K = 14,
    DS4N_IQ2_XXS = 16, DS4N_IQ4_NL = 20, DS4N_IQ4_XS = 23, DS4N_BF16 = 30, DS4N_MXFP4 = 39,
};

/* SIMD levels; DS4N_SIMD_AUTO picks the best the CPU supports. AVX512 is F, BW, VL and DQ
 * (with the AVX2 level's FMA and F16C); AMX is that set with the decode matvecs of some types
 * on AMX tiles (AMX-TILE, AMX-BF16, AVX512-BF16, and the tile state granted by the OS). */
enum ds4n_simd {
    DS4N_SIMD_AUTO = -1, DS4N_SIMD_SCALAR = 0, DS4N_SIMD_AVX2 = 1, DS4N_SIMD_NEON = 2,
    DS4N_SIMD_AVX512 = 3, DS4N_SIMD_AMX = 4,
};

/* Selects the kernel set for the whole process and returns the level now in force
 * (a level the CPU lacks falls back to scalar). Tests use it to check SIMD against scalar. */
int ds4n_set_simd(int level);
int ds4n_simd_level(void);

/* Type traits; 0 for a type this library cannot run. */
int ds4n_type_supported(int type);
int64_t ds4n_type_block_size(int type);   /* values per block */
int64_t ds4n_type_block_bytes(int type);  /* bytes per block */

/* Row kernels: n is a multiple of the type's block size. */
void ds4n_dequantize(int type, const void *src, float *dst, int64_t n);
float ds4n_dot(int type, const void *w, const float *x, int64_t n);

/* Thread pool: n_threads workers including the caller. run() calls fn(ctx, ith, nth)
 * once for every ith in [0, nth) and returns when all are done. Not reentrant: one thread
 * at a time runs jobs on a pool. Shares are claimed, not assigned, so any ith may run on any
 * of the pool's threads (the caller included); nth is always the pool's thread count. */
typedef struct ds4n_pool ds4n_pool;
ds4n_pool *ds4n_pool_new(int n_threads);
void ds4n_pool_free(ds4n_pool *pool);
int ds4n_pool_threads(const ds4n_pool *pool);
void ds4n_pool_run(ds4n_pool *pool, void (*fn)(void *ctx, int ith, int nth), void *ctx);

/* Precision of the pool's matmuls: 0 exact (float32 activations, the default), 2 or 3
 * (activations split into that many int8 limbs per 32-value block, integer dot products;
 * quants_int.h). Types without an integer kernel keep the exact path. Returns limbs, or -1
 * for a bad argument. Set it while no job runs on the pool. */
int ds4n_pool_set_precision(ds4n_pool *pool, int limbs);
/* 1 when type has an integer-activation kernel. */
int ds4n_int_type_supported(int type);
/* The integer kernels of the current SIMD level, for logs and tests: "scalar", "avx2",
 * "avx512-vnni", "neon", "neon+dotprod", ... (slots a set leaves out run the scalar ones). */
const char *ds4n_int_kernel_set(void);

/* Y[t*rows + r] = sum_k W[r][k] * X[t*K + k] for t < T, r < rows.
 * W: rows x K of the given type, row-major (GGUF layout: ne0 = K); X, Y float32.
 * T == 1 runs fused dot kernels (decode); 2..8 the same kernels with each weight block decoded
 * once for all tokens, token t's row bitwise equal to a T == 1 call with it alone (batched
 * decode); T > 8 a blocked matrix-matrix product (prefill).
 * Work is split across the pool; pool may be NULL (single-threaded). */
void ds4n_matmul(ds4n_pool *pool, int type, const void *W, int64_t rows, int64_t K,
                 const float *X, int64_t T, float *Y);

/* The same, for a caller that is already running inside a pool task: computes only the
 * share of rows belonging to worker ith of nth (for fusing ops in one pool dispatch). */
void ds4n_matmul_part(int type, const void *W, int64_t rows, int64_t K,
                      const float *X, int64_t T, float *Y, int ith, int nth);

/* Multi-threaded read bandwidth, bytes per second, the bound decode is measured against: the
 * pool's threads each stream their share of a buffer of `bytes` (allocated and written here:
 * the bytes a decode step reads, or far more than the caches), eight sequential streams per
 * thread, on 2 MB huge pages when huge_pages is set and the OS grants them; the best of reps
 * passes. -1 if it cannot allocate. */
double ds4n_read_bandwidth(ds4n_pool *pool, int64_t bytes, int reps, int huge_pages);

/* The compute bound prefill is measured against: the multiply-add rate of ONE core (the
 * calling thread, in its CPU time; a caller scales it by its threads) for the instruction the
 * prefill kernel of `type` at `limbs` (0: exact, 2 or 3: the integer path) runs on the SIMD
 * level in force: f32 FMA on the exact path (and for types with no integer kernel), else the
 * integer kernels' dot product (AVX-512 VNNI: VPDPBUSD for the block format, VPDPWSSD for the
 * super-block format; AVX2: VPMADDUBSW with VPMADDWD, VPMADDWD; NEON: SDOT where the block
 * format's SDOT kernels were chosen, else SMULL with SADALP, and SMLAL). lane_rate is the
 * instruction's multiply-adds per second, best of reps runs of iters rounds of 12 chains;
 * products its multiply-adds per weight multiply-add (1 for f32, limbs for the block format,
 * limbs - 1 for the super-block format); rate = lane_rate / products, the weight
 * multiply-adds (rows x K x tokens) per second the kernel could reach doing nothing else.
 * A level without a kernel of its own has no probe: instr NULL, rates 0 (the scalar level).
 * Returns 0, or -1 for a bad argument. */
typedef struct {
    const char *instr; /* the instruction timed (static text), NULL: no probe */
    int32_t products;
    double lane_rate, rate;
} ds4n_mac_peak_info;
int ds4n_mac_peak(int type, int limbs, int64_t iters, int reps, ds4n_mac_peak_info *out);

/* Next-token draw from the candidates' logits values[0..n): top_k (0 = off), then top_p
 * (1 = off), then min_p (0 = off), judged at temperature 1, then temperature (> 0) reshapes
 * the draw among the survivors; u in [0, 1) is the one uniform number the draw uses.
 * Returns the chosen position (the first NaN, or the best if its logit is infinite, as a
 * greedy pick); -1 for a bad argument, -2 out of memory. One pass per filter, no sort of
 * the vocabulary, no allocation per call. */
int64_t ds4n_sample(const float *values, int64_t n, int32_t top_k, float top_p, float min_p,
                    float temperature, double u);

/* Decode and prefill profile (off by default; costs one relaxed load per hook when off).
 * enable(1) clears the counters and starts timing every pool dispatch and matmul part; mark()
 * closes one forward pass (call it between tokens, or a prefill's chunks). read() copies up
 * to max entries (one per matmul shape: type, decode or prefill, rows, K), returns how many
 * exist, and fills
 * totals[DS4N_PROFILE_TOTALS]: dispatches, dispatch wall ns, busy ns (summed over
 * threads), wall and busy ns of non-matmul pool work (attention), wall ns of the marked
 * forward passes from first dispatch start to last dispatch end, passes marked, sync ns
 * (dispatch wall beyond its busiest thread's time: publishing, wake-up, barrier), join ns
 * (summed delay from a dispatch's start to each worker's first share), joins (workers that
 * ran a share), absent (workers that ran none: asleep or descheduled, their shares taken by
 * others). The busiest thread's time is shared among the matmuls and other work by busy time.
 * An entry's tokens is the T of its calls summed: its multiply-adds are tokens x rows x K. */
typedef struct {
    int32_t type, prefill;
    int64_t rows, K, calls, wall_ns, busy_ns;
    int64_t parts; /* shares run: calls x threads */
    int64_t tokens; /* tokens multiplied, summed over the calls (T of each) */
} ds4n_profile_entry;
#define DS4N_PROFILE_TOTALS 11
void ds4n_profile_enable(int on);
void ds4n_profile_mark(void);
int ds4n_profile_read(ds4n_profile_entry *out, int max, int64_t *totals);

#ifdef __cplusplus
}
#endif
#endif
