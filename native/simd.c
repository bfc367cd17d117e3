/* SIMD level selection: which kernel set the whole process runs.
 *
 * The level is chosen once at load (best the CPU has, or DS4N_SIMD=scalar|avx2|avx512|amx|neon)
 * and may be changed with ds4n_set_simd() by tests. Each set may leave row kernels out; resolution
 * fills those from the scalar set so a lookup is one table read. */
#include <stdlib.h>
#include <string.h>

#include "quants.h"
#include "quants_int.h"

static struct ds4n_row_kernels active[DS4N_TYPE_SLOTS];
static ds4n_tile_fn active_tile;
static int active_tile_cols;
static int active_hw_prefetch;
static int active_level;

#ifdef DS4N_HAVE_AVX2
#include <cpuid.h>
/* Not every compiler's __builtin_cpu_supports knows "f16c": ask CPUID (leaf 1, ECX bit 29). */
static int x86_has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}
#endif

static int cpu_has(int level) {
    switch (level) {
    case DS4N_SIMD_SCALAR:
        return 1;
#ifdef DS4N_HAVE_AVX2
    case DS4N_SIMD_AVX2:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && x86_has_f16c();
    case DS4N_SIMD_AVX512:
        /* The compiler runtime reports AVX-512 features only when the OS saves the zmm and
         * mask state (XCR0), so this also checks the kernel enabled them. */
        return cpu_has(DS4N_SIMD_AVX2) && __builtin_cpu_supports("avx512f") &&
               __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
               __builtin_cpu_supports("avx512dq");
    case DS4N_SIMD_AMX: {
        static int usable = -1; /* asked once: the tile state is granted per process */
        if (usable < 0) usable = cpu_has(DS4N_SIMD_AVX512) && ds4n_amx_usable();
        return usable;
    }
#endif
#ifdef DS4N_HAVE_NEON
    case DS4N_SIMD_NEON:
        return 1; /* baseline on aarch64 */
#endif
    default:
        return 0;
    }
}

static const struct ds4n_kernel_set *kernel_set(int level) {
#ifdef DS4N_HAVE_AVX2
    if (level == DS4N_SIMD_AVX2) return &ds4n_avx2_set;
    if (level == DS4N_SIMD_AVX512 || level == DS4N_SIMD_AMX) return &ds4n_avx512_set;
#endif
#ifdef DS4N_HAVE_NEON
    if (level == DS4N_SIMD_NEON) return &ds4n_neon_set;
#endif
    return &ds4n_scalar_set;
}

static int best_level(void) {
    const char *env = getenv("DS4N_SIMD");
    if (env && strcmp(env, "scalar") == 0) return DS4N_SIMD_SCALAR;
    if (env && strcmp(env, "avx2") == 0) return DS4N_SIMD_AVX2;
    if (env && strcmp(env, "neon") == 0) return DS4N_SIMD_NEON;
    if (env && strcmp(env, "avx512") == 0) return DS4N_SIMD_AVX512;
    if (env && strcmp(env, "amx") == 0) return DS4N_SIMD_AMX;
    if (cpu_has(DS4N_SIMD_AMX)) return DS4N_SIMD_AMX;
    if (cpu_has(DS4N_SIMD_AVX512)) return DS4N_SIMD_AVX512;
    if (cpu_has(DS4N_SIMD_AVX2)) return DS4N_SIMD_AVX2;
    if (cpu_has(DS4N_SIMD_NEON)) return DS4N_SIMD_NEON;
    return DS4N_SIMD_SCALAR;
}

int ds4n_set_simd(int level) {
    if (level == DS4N_SIMD_AUTO) level = best_level();
    if (!cpu_has(level)) level = DS4N_SIMD_SCALAR;
    const struct ds4n_kernel_set *set = kernel_set(level), *scalar = &ds4n_scalar_set;
    for (int t = 0; t < DS4N_TYPE_SLOTS; t++) {
        const struct ds4n_row_kernels *own = &set->row[t], *fallback = &scalar->row[t];
        active[t].dequantize = own->dequantize ? own->dequantize : fallback->dequantize;
        active[t].dot = own->dot ? own->dot : fallback->dot;
        /* A multi-row kernel only with the set's own dot, so a matvec never mixes levels. */
        active[t].rows = own->dot ? own->rows : fallback->rows;
        active[t].cols = own->dot ? own->cols : fallback->cols; /* matches rows, else dot */
        active[t].mv = own->mv;
#ifdef DS4N_HAVE_AVX2
        if (level == DS4N_SIMD_AMX) active[t].mv = ds4n_amx_mv[t];
#endif
    }
    active_tile = set->tile;
    active_tile_cols = set->tile_cols ? set->tile_cols : DS4N_TILE_COLS;
    active_hw_prefetch = set->hw_prefetch;
    active_level = level;
    ds4n_int_select(level);
    return level;
}

int ds4n_simd_level(void) {
    return active_level;
}

const struct ds4n_row_kernels *ds4n_active_kernels(int type) {
    return ds4n_traits(type) ? &active[type] : NULL;
}

ds4n_tile_fn ds4n_active_tile(void) {
    return active_tile;
}

int ds4n_active_tile_cols(void) {
    return active_tile_cols;
}

int ds4n_active_hw_prefetch(void) {
    return active_hw_prefetch;
}

/* Chosen at load, before any kernel call (and so before any worker thread exists). */
__attribute__((constructor)) static void choose_at_load(void) { ds4n_set_simd(DS4N_SIMD_AUTO); }
