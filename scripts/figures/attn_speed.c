/* Speed of the prefill attention kernel at depth, in the thread's CPU time (the machine is
 * shared; CPU time is far steadier than wall time there): one kv head's jobs of a prefill
 * chunk, as decoder_attention.c plans them (blocks of 48 query rows, G query heads per kv
 * head), against an f16 KV cache of `depth` earlier positions. Prints the multiply-adds per
 * second (Q·K and P·V), to set against the matmuls' (int_path_speed.py) and one core's f32
 * FMA peak (int_path_speed.py peak).
 *
 *   cc -O2 -I native -o /tmp/attn_speed scripts/figures/attn_speed.c native/build/libds4n.so -lm
 *   LD_LIBRARY_PATH=native/build /tmp/attn_speed HEAD_DIM G DEPTH CHUNK   # e.g. 128 6 3840 256
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attention.h"

#define QROWS 48 /* decoder_internal.h: query rows per attention job */

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static float frand(void) { return (float)rand() / RAND_MAX * 2.0f - 1.0f; }

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: attn_speed HEAD_DIM G DEPTH CHUNK\n");
        return 2;
    }
    const int hd = atoi(argv[1]), G = atoi(argv[2]), depth = atoi(argv[3]), chunk = atoi(argv[4]);
    const int64_t n = depth + chunk, vrow = ds4n_kv_row_bytes(DS4N_KV_F16, hd);
    char *K = calloc((size_t)((n + DS4N_KT) / DS4N_KT * DS4N_KT), (size_t)vrow);
    char *V = calloc((size_t)n, (size_t)vrow);
    float *x = malloc(sizeof(float) * hd);
    for (int64_t p = 0; p < n; p++) {
        for (int d = 0; d < hd; d++) x[d] = frand();
        ds4n_kv_tile_store(DS4N_KV_F16, x, hd, K + p / DS4N_KT * DS4N_KT * vrow, (int)(p % DS4N_KT));
        for (int d = 0; d < hd; d++) x[d] = frand();
        ds4n_kv_pack_row(DS4N_KV_F16, x, hd, V + p * vrow);
    }
    const int qblock = QROWS / G > 0 ? QROWS / G : 1;
    float *q = malloc(sizeof(float) * chunk * G * hd), *o = malloc(sizeof(float) * chunk * G * hd);
    for (int64_t i = 0; i < (int64_t)chunk * G * hd; i++) q[i] = frand() * 0.1f;
    float *scratch = malloc(sizeof(float) * ds4n_attn_scratch_floats(qblock * G, hd));
    double best = 1e30, macs = 0.0;
    for (int round = 0; round < 5; round++) {
        const double t0 = now();
        macs = 0.0;
        for (int t = 0; t < chunk; t += qblock) {
            const int nt = chunk - t < qblock ? chunk - t : qblock;
            ds4n_attn_job j = {.q = q + (int64_t)t * G * hd, .q_stride = (int64_t)G * hd,
                               .o = o + (int64_t)t * G * hd, .o_stride = (int64_t)G * hd,
                               .n_tok = nt, .n_group = G, .head_dim = hd, .pos0 = depth + t,
                               .k = K, .v = V, .kv_type = DS4N_KV_F16, .k0 = 0, .k1 = INT64_MAX};
            ds4n_attn_run(&j, scratch);
            for (int i = 0; i < nt; i++) macs += 2.0 * G * hd * (double)(depth + t + i + 1);
        }
        const double dt = now() - t0;
        if (dt < best) best = dt;
    }
    printf("attention hd %d G %d depth %d chunk %d: %.2f ms per kv head, %.1f G MAC/s\n", hd, G,
           depth, chunk, best * 1e3, macs / best / 1e9);
    return o[0] == 12345.0f;
}
