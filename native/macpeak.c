/* The compute bound prefill is measured against: the multiply-add rate of one core for the
 * instruction the prefill kernel of a weight type runs at a precision, on the SIMD level in
 * force (as ds4n_read_bandwidth is decode's bound).
 *
 * The instruction follows the kernels' own choice: the exact path's f32 tile FMA for every
 * type at limbs 0, and for types with no integer kernel; the integer path's dot product of the
 * kernel set quants_int.c selected (ds4n_active_int_set), by the activations' format: the
 * block format (Q4_0, Q4_1, Q8_0) multiplies each weight by `limbs` int8 limbs, the
 * super-block format (Q4_K, Q6_K) by limbs - 1 int16 limbs. The instruction's rate over those
 * products is the weight multiply-adds per second the kernel could reach doing nothing else:
 * an upper bound that leaves out the unpacking, the float steps and the loads.
 *
 * A level with no kernel of its own has no probe (instr NULL, rates 0), rather than a figure
 * for an instruction nothing runs: the scalar level (the compiler's code). On NEON the block
 * format's instruction depends on the kernel chosen for the type (SDOT where the CPU has it,
 * else SMULL), so the probe follows that choice. */
#include <string.h>

#include "ds4n.h"
#include "macpeak.h"
#include "quants_int.h"

struct peak_choice {
    ds4n_peak_fn fn;
    const char *instr;
};

static struct peak_choice float_peak(void) {
    switch (ds4n_simd_level()) {
#if defined(__x86_64__) || defined(_M_X64)
    case DS4N_SIMD_AVX2: return (struct peak_choice){ds4n_peak_avx2_fma, "VFMADD231PS ymm (f32)"};
    case DS4N_SIMD_AVX512:
    case DS4N_SIMD_AMX: /* AMX serves decode's matvecs; prefill runs the AVX-512 tile */
        return (struct peak_choice){ds4n_peak_avx512_fma, "VFMADD231PS zmm (f32)"};
#endif
#if defined(__aarch64__)
    case DS4N_SIMD_NEON: return (struct peak_choice){ds4n_peak_neon_fma, "FMLA 4s (f32)"};
#endif
    default: return (struct peak_choice){NULL, NULL};
    }
}

static struct peak_choice int_peak(int type, int sb) {
    const struct ds4n_int_set *set = ds4n_active_int_set();
#if defined(__x86_64__) || defined(_M_X64)
    (void)type;
    if (set == &ds4n_int_avx512)
        return sb ? (struct peak_choice){ds4n_peak_avx512_dpwssd, "VPDPWSSD zmm (int16)"}
                  : (struct peak_choice){ds4n_peak_avx512_dpbusd, "VPDPBUSD zmm (uint8 x int8)"};
    if (set == &ds4n_int_avx2)
        return sb ? (struct peak_choice){ds4n_peak_avx2_madd, "VPMADDWD ymm (int16)"}
                  : (struct peak_choice){ds4n_peak_avx2_maddubs,
                                         "VPMADDUBSW+VPMADDWD ymm (uint8 x int8)"};
#elif defined(__aarch64__)
    if (set == &ds4n_int_neon) {
        if (sb) return (struct peak_choice){ds4n_peak_neon_smlal, "SMLAL 4s (int16)"};
        const ds4n_int_fn dot = ds4n_int_neon_dotprod.row[type];
        if (dot && ds4n_active_int_kernel(type) == dot)
            return (struct peak_choice){ds4n_peak_neon_sdot, "SDOT 4s (int8)"};
        return (struct peak_choice){ds4n_peak_neon_smull, "SMULL+SADALP (int8)"};
    }
#else
    (void)type, (void)sb, (void)set;
#endif
    return (struct peak_choice){NULL, NULL};
}

int ds4n_mac_peak(int type, int limbs, int64_t iters, int reps, ds4n_mac_peak_info *out) {
    if (!out || iters < 1 || reps < 1 || (limbs != 0 && limbs != 2 && limbs != 3) ||
        !ds4n_type_supported(type))
        return -1;
    memset(out, 0, sizeof *out);
    const int integer = limbs && ds4n_int_type_supported(type);
    const int sb = integer && ds4n_int_type_sb(type);
    const struct peak_choice c = integer ? int_peak(type, sb) : float_peak();
    out->products = !integer ? 1 : sb ? limbs - 1 : limbs;
    if (!c.fn) return 0;
    out->instr = c.instr;
    for (int r = 0; r < reps; r++) {
        const double rate = c.fn(iters);
        if (rate > out->lane_rate) out->lane_rate = rate;
    }
    out->rate = out->lane_rate / out->products;
    return 0;
}
