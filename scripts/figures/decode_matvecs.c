/* A decode token's matvecs alone, at a llama-shaped model's sizes, dispatched as the engine
 * dispatches them (decoder_attention.c, decoder_ffn.c: Q/K/V in one pool job, then O, then
 * gate and up in one, then down; the output head last), over distinct weights per layer (the
 * whole set far larger than the L3, so every byte streams from memory as in a model). No
 * attention, norms or Python: what the matvecs and the pool cost, against the read bound.
 *
 *   cc -O2 -I native -o /tmp/decode_matvecs scripts/figures/decode_matvecs.c \
 *       native/build/libds4n.so -lm -pthread
 *   LD_LIBRARY_PATH=native/build /tmp/decode_matvecs SHAPE THREADS LIMBS TOKENS
 *
 * SHAPE: 1.5b (Qwen2.5-Coder-1.5B: 1536 wide, 28 layers, K/V 256 rows, FFN 8960, 151936
 * vocab), 1.7b (SmolLM2-1.7B: 2048, 24, 2048, 8192, 49152) or 8b (Qwen3-8B: 4096, 36,
 * 1024, 12288, 151936; its 4096 query rows are the width). Types as llama.cpp's Q4_K_M
 * gives them: Q4_K, with attn_v and ffn_down Q6_K in the layers its use_more_bits rule picks,
 * the head Q6_K. LIMBS: 0 exact, 2 int2, 3 int3. Prints, per part, the time per token (one
 * thread: its CPU time; several: wall time; the median token of TOKENS) and the GB/s, then
 * the read bandwidth of the same pool (ds4n_read_bandwidth) for the bound. Medians, not
 * bests: in a VM whose host is busy, a thread's CPU time now and then misses a slice of
 * the work (steal time taken off in a lump), and the best of many runs picks those. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "figure_util.h"

#include "ds4n.h"

enum { P_QKV, P_O, P_GATE_UP, P_DOWN, P_HEAD, N_PARTS };
static const char *part_name[N_PARTS] = {"qkv", "o", "gate+up", "down", "head"};

struct mat {
    int type;
    int64_t rows, K;
    void *w;
};

struct layer {
    struct mat q, k, v, o, gate, up, down;
};

static int64_t row_bytes(int type, int64_t K) {
    return K / ds4n_type_block_size(type) * ds4n_type_block_bytes(type);
}

static int64_t mat_bytes(const struct mat *m) { return m->rows * row_bytes(m->type, m->K); }

static void fill(struct mat *m) {
    m->w = fig_weights(m->type, mat_bytes(m), ds4n_type_block_bytes(m->type));
}

struct job {
    const struct mat *m[3];
    int n;
    const float *x;
    float *y[3];
};

static void task(void *ctx, int ith, int nth) {
    const struct job *j = ctx;
    for (int i = 0; i < j->n; i++)
        ds4n_matmul_part(j->m[i]->type, j->m[i]->w, j->m[i]->rows, j->m[i]->K, j->x, 1, j->y[i],
                         ith, nth);
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: decode_matvecs 1.5b|1.7b|8b THREADS LIMBS TOKENS\n");
        return 2;
    }
    int E, L, KV, F, V;
    if (!strcmp(argv[1], "1.5b")) E = 1536, L = 28, KV = 256, F = 8960, V = 151936;
    else if (!strcmp(argv[1], "1.7b")) E = 2048, L = 24, KV = 2048, F = 8192, V = 49152;
    else if (!strcmp(argv[1], "8b")) E = 4096, L = 36, KV = 1024, F = 12288, V = 151936;
    else return fprintf(stderr, "unknown shape %s\n", argv[1]), 2;
    const int threads = atoi(argv[2]), limbs = atoi(argv[3]), tokens = atoi(argv[4]);
    ds4n_pool *pool = ds4n_pool_new(threads);
    if (ds4n_pool_set_precision(pool, limbs) < 0) return fprintf(stderr, "bad limbs\n"), 2;
    srand(1);
    struct layer *ly = calloc((size_t)L, sizeof *ly);
    int64_t part_bytes[N_PARTS] = {0};
    for (int i = 0; i < L; i++) {
        const int hi = fig_more_bits(i, L) ? DS4N_Q6_K : DS4N_Q4_K;
        ly[i] = (struct layer){
            .q = {DS4N_Q4_K, E, E, 0}, .k = {DS4N_Q4_K, KV, E, 0}, .v = {hi, KV, E, 0},
            .o = {DS4N_Q4_K, E, E, 0}, .gate = {DS4N_Q4_K, F, E, 0}, .up = {DS4N_Q4_K, F, E, 0},
            .down = {hi, E, F, 0},
        };
        struct mat *all[7] = {&ly[i].q, &ly[i].k, &ly[i].v, &ly[i].o, &ly[i].gate, &ly[i].up,
                              &ly[i].down};
        for (int j = 0; j < 7; j++) fill(all[j]);
        part_bytes[P_QKV] += mat_bytes(&ly[i].q) + mat_bytes(&ly[i].k) + mat_bytes(&ly[i].v);
        part_bytes[P_O] += mat_bytes(&ly[i].o);
        part_bytes[P_GATE_UP] += mat_bytes(&ly[i].gate) + mat_bytes(&ly[i].up);
        part_bytes[P_DOWN] += mat_bytes(&ly[i].down);
    }
    struct mat head = {DS4N_Q6_K, V, E, 0};
    fill(&head);
    part_bytes[P_HEAD] = mat_bytes(&head);
    const int64_t big = F > E ? F : E;
    float *x = malloc(sizeof(float) * (size_t)big), *xf = malloc(sizeof(float) * (size_t)big);
    for (int i = 0; i < big; i++) x[i] = (float)rand() / RAND_MAX * 2 - 1, xf[i] = x[i] * 0.5f;
    float *q = malloc(sizeof(float) * (size_t)E), *k = malloc(sizeof(float) * (size_t)KV);
    float *v = malloc(sizeof(float) * (size_t)KV), *o = malloc(sizeof(float) * (size_t)E);
    float *g = malloc(sizeof(float) * (size_t)F), *u = malloc(sizeof(float) * (size_t)F);
    float *d = malloc(sizeof(float) * (size_t)E), *logits = malloc(sizeof(float) * (size_t)V);

    double *times = calloc((size_t)(N_PARTS + 1) * (size_t)tokens, sizeof *times);
    for (int t = 0; t <= tokens; t++) { /* token 0 warms up */
        double sum[N_PARTS] = {0};
        const double t_tok = fig_now(threads);
        for (int i = 0; i < L; i++) {
            struct job jq = {{&ly[i].q, &ly[i].k, &ly[i].v}, 3, x, {q, k, v}};
            struct job jo = {{&ly[i].o}, 1, x, {o}};
            struct job jg = {{&ly[i].gate, &ly[i].up}, 2, x, {g, u}};
            struct job jd = {{&ly[i].down}, 1, xf, {d}};
            struct job *js[4] = {&jq, &jo, &jg, &jd};
            for (int p = 0; p < 4; p++) {
                const double t0 = fig_now(threads);
                ds4n_pool_run(pool, task, js[p]);
                sum[p] += fig_now(threads) - t0;
            }
        }
        struct job jh = {{&head}, 1, x, {logits}};
        const double t0 = fig_now(threads);
        ds4n_pool_run(pool, task, &jh);
        sum[P_HEAD] += fig_now(threads) - t0;
        const double tok = fig_now(threads) - t_tok;
        if (t == 0) continue;
        for (int p = 0; p < N_PARTS; p++) times[p * tokens + t - 1] = sum[p];
        times[N_PARTS * tokens + t - 1] = tok;
    }
    double med[N_PARTS + 1];
    for (int p = 0; p <= N_PARTS; p++) {
        qsort(times + p * tokens, (size_t)tokens, sizeof *times, fig_cmp_double);
        med[p] = times[p * tokens + tokens / 2];
    }
    /* How the workers joined the dispatches (the native profile's pool counters), over a
     * few more tokens: a worker that missed a dispatch left its share to the others. */
    int64_t totals[DS4N_PROFILE_TOTALS];
    ds4n_profile_entry entries[64];
    ds4n_profile_enable(1);
    for (int t = 0; t < 3; t++)
        for (int i = 0; i < L; i++) {
            struct job jg = {{&ly[i].gate, &ly[i].up}, 2, x, {g, u}};
            struct job jd = {{&ly[i].down}, 1, xf, {d}};
            ds4n_pool_run(pool, task, &jg);
            ds4n_pool_run(pool, task, &jd);
        }
    ds4n_profile_read(entries, 64, totals);
    ds4n_profile_enable(0);
    int64_t total = 0;
    printf("# %s, %d thread(s), limbs %d, %s time, median of %d tokens\n", argv[1], threads, limbs,
           threads == 1 ? "CPU" : "wall", tokens);
    for (int p = 0; p < N_PARTS; p++) {
        total += part_bytes[p];
        printf("%-8s %8.3f ms %8.1f MB %6.1f GB/s\n", part_name[p], 1e3 * med[p],
               part_bytes[p] / 1e6, part_bytes[p] / med[p] / 1e9);
    }
    printf("%-8s %8.3f ms %8.1f MB %6.1f GB/s (%d dispatches)\n", "token", 1e3 * med[N_PARTS],
           total / 1e6, total / med[N_PARTS] / 1e9, 4 * L + 1);
    if (threads > 1)
        printf("pool: workers absent from %.1f%% of dispatches, join %.1f us after the start\n",
               100.0 * (double)totals[10] / (double)(totals[9] + totals[10]),
               totals[9] ? (double)totals[8] / (double)totals[9] / 1e3 : 0.0);
    printf("read bandwidth %.1f GB/s (%d threads, huge pages)\n",
           ds4n_read_bandwidth(pool, 512 << 20, 3, 1) / 1e9, threads);
    ds4n_pool_free(pool);
    return 0;
}
