/* Instructions per super-block (256 values, one token) of the integer path's kernels on
 * aarch64, counted under qemu-user (no arm64 machine here, and qemu is no speed measure:
 * these are instruction counts, not times). Run by scripts/figures/int_insn_count.sh, which
 * builds this against the kernel sources and counts the executed instructions of runs that
 * differ by one kernel call and by K.
 *
 *   int_insn_count LEVEL TYPE LIMBS K REPS
 *
 * LEVEL: a ds4n_simd value (0 scalar, 2 neon); TYPE: a ds4n type id; LIMBS 2 or 3. Quantizes
 * one token of K values, then calls the level's integer row kernel REPS times (T = 1). */
#include <stdio.h>
#include <stdlib.h>

#include "ds4n.h"
#include "quants_int.h"

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: %s LEVEL TYPE LIMBS K REPS\n", argv[0]);
        return 2;
    }
    const int level = atoi(argv[1]), type = atoi(argv[2]), limbs = atoi(argv[3]);
    const int64_t K = atoll(argv[4]);
    const int reps = atoi(argv[5]);
    ds4n_set_simd(level);
    const struct ds4n_type_traits *tt = ds4n_traits(type);
    const ds4n_int_fn kern = ds4n_active_int_kernel(type);
    if (!tt || !kern || K % 256 || (limbs != 2 && limbs != 3)) return 2;
    const int64_t nblk = K / tt->block_size, rb = nblk * tt->block_bytes;
    uint8_t *w = malloc((size_t)rb);
    for (int64_t i = 0; i < rb; i++) w[i] = (uint8_t)(i * 37 + 11);
    for (int64_t b = 0; b < nblk; b++) { /* finite f16 scales (1.0): the usual path */
        uint8_t *p = w + b * tt->block_bytes;
        const int at = type == DS4N_Q6_K ? 208 : 0;
        p[at] = 0x00, p[at + 1] = 0x3c;
        if (type == DS4N_Q4_K || type == DS4N_Q4_1) p[2] = 0x00, p[3] = 0x3c;
    }
    float *x = malloc(sizeof(float) * (size_t)K);
    for (int64_t i = 0; i < K; i++) x[i] = (float)((i * 7919) % 2001 - 1000) / 1000.0f;
    const int sb = ds4n_int_type_sb(type);
    void *buf = aligned_alloc(64, (ds4n_xq_bytes(limbs, sb, K, 1) + 63) & ~(size_t)63);
    struct ds4n_xq xq;
    ds4n_xq_init(&xq, buf, limbs, sb, K, 1);
    ds4n_xq_quantize(&xq, x, 0, 1);
    /* y is not printed: printf's instruction count depends on the value */
    volatile float sink = 0.0f;
    for (int r = 0; r < reps; r++) {
        float y;
        kern(w, &xq, 0, 1, &y, 1);
        sink = y;
    }
    (void)sink;
    free(buf), free(x), free(w);
    return 0;
}
