/* The block-format kernels of the integer path with SDOT (FEAT_DotProd: Armv8.2 and later,
 * optional there, e.g. Cortex-A55/A76, Neoverse N1, Apple M1): quants_int_neon_block.h built
 * with DS4N_NEON_DOT 1. This file alone is compiled with -march=armv8.2-a+dotprod (the
 * Makefile), and ds4n_int_select runs it only when the CPU reports SDOT, so the library
 * still loads and runs on a plain Armv8.0 CPU. The super-block kernels, the quantizer and
 * prefill stay quants_int_neon.c's (its slots here are NULL). */
#define DS4N_NEON_DOT 1
#include "quants_int_neon_block.h"

const struct ds4n_int_set ds4n_int_neon_dotprod = {
    .row = {[DS4N_Q8_0] = int_q8_0, [DS4N_Q4_0] = int_q4_0, [DS4N_Q4_1] = int_q4_1},
    .rows = {[DS4N_Q8_0] = rows_q8_0, [DS4N_Q4_0] = rows_q4_0, [DS4N_Q4_1] = rows_q4_1},
};
