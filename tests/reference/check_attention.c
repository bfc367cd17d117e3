/* Checks the SIMD attention, SwiGLU and GeGLU kernels against the scalar ones on random jobs:
 * prefill blocks, decode rows, split key ranges, grouped heads of several sizes, sliding
 * windows and attention sinks, over a float32, an f16 and a q8_0 KV cache (the scalar kernel
 * also against the definition on the values the cache holds), and each token's rows of a
 * job run alone (a decode step, in other row groups) bitwise against the whole job's. Built and run by
 * tests/engine/test_llama_forward.py and `make -C native check-neon` (natively for AVX2 and, on a CPU
 * that has it, AVX-512; under qemu for NEON).
 * Prints the largest difference; exits 1 when it exceeds the bound. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "ds4n.h"

int ds4n_simd_level(void) { return 0; } /* the kernels are called directly */

/* The SIMD kernel sets this build has; each is checked when the CPU runs it. */
static const struct simd_set {
    const char *name;
    void (*attn)(const ds4n_attn_job *, float *);
    void (*swiglu)(float *, const float *, int64_t);
    void (*geglu)(float *, const float *, int64_t);
} SETS[] = {
#if defined(__aarch64__)
    {"neon", ds4n_attn_neon, ds4n_swiglu_neon, ds4n_geglu_neon},
#else
    {"avx2", ds4n_attn_avx2, ds4n_swiglu_avx2, ds4n_geglu_avx2},
    {"avx512", ds4n_attn_avx512, ds4n_swiglu_avx512, ds4n_geglu_avx512},
#endif
};

static int cpu_runs(const char *name) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (strcmp(name, "avx512") == 0)
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    (void)name;
    return 1;
#endif
}

static float frand(void) { return (float)rand() / RAND_MAX * 2.0f - 1.0f; }

static float kval(const ds4n_attn_job *j, long p, int d) {
    const long tile = (long)ds4n_kv_row_bytes(j->kv_type, j->head_dim) * DS4N_KT;
    return ds4n_kv_tile_at(j->kv_type, (const char *)j->k + p / DS4N_KT * tile,
                           (int)(p % DS4N_KT), d, j->head_dim);
}

static float vval(const ds4n_attn_job *j, long p, int d) {
    const long row = (long)ds4n_kv_row_bytes(j->kv_type, j->head_dim);
    return ds4n_kv_row_at(j->kv_type, (const char *)j->v + p * row, d);
}

/* The textbook definition in double: softmax over the row's visible keys (and its sink). */
static void naive(const ds4n_attn_job *j, int r, double *out) {
    const int hd = j->head_dim, t = r / j->n_group, g = r % j->n_group;
    const long pos = j->pos0 + t;
    long lo = j->k0, hi = j->k1 < pos + 1 ? j->k1 : pos + 1;
    if (j->keys_end > 0) { /* not causal: up to the end, or to the symmetric window's */
        hi = j->k1 < j->keys_end ? j->k1 : j->keys_end;
        if (j->window > 0 && pos + j->window < hi) hi = pos + j->window;
    }
    if (j->window > 0 && pos - j->window + 1 > lo) lo = pos - j->window + 1;
    const float *q = j->q + t * j->q_stride + g * hd;
    double mx = j->sinks ? j->sinks[g] : -INFINITY, sum = 0.0;
    for (long p = lo; p < hi; p++) {
        double s = 0.0;
        for (int d = 0; d < hd; d++) s += (double)q[d] * kval(j, p, d);
        if (s > mx) mx = s;
    }
    for (int d = 0; d < hd; d++) out[d] = 0.0;
    if (j->sinks) sum = exp(j->sinks[g] - mx);
    for (long p = lo; p < hi; p++) {
        double s = 0.0;
        for (int d = 0; d < hd; d++) s += (double)q[d] * kval(j, p, d);
        const double e = exp(s - mx);
        sum += e;
        for (int d = 0; d < hd; d++) out[d] += e * vval(j, p, d);
    }
    for (int d = 0; d < hd; d++) out[d] /= sum;
}

/* One SIMD set against the scalar kernels (and the scalar kernel against the definition);
 * returns the largest difference. */
static float check_set(const struct simd_set *set, int hd, void *const *kt, void *const *vt,
                       int *row_mismatch) {
    float *scratch = malloc(sizeof(float) * ds4n_attn_scratch_floats(64, hd));
    float worst = 0.0f, worst_type[3] = {0};
    /* window > 0: a sliding window; sinks: per-head sink logits (normalized jobs only);
     * keys_end > 0: not causal, the keys up to it (symmetric within a window). */
    const struct {
        int n_tok, G;
        long pos0, k0, k1;
        int split;
        long window;
        int sinks;
        long keys_end;
    } cases[] = {
        {1, 3, 0, 0, 1L << 40, 0, 0, 0, 0},     {1, 3, 300, 0, 1L << 40, 0, 0, 0, 0},
        {16, 3, 0, 0, 1L << 40, 0, 0, 0, 0},    {16, 3, 200, 0, 1L << 40, 0, 0, 0, 0},
        {5, 3, 77, 0, 1L << 40, 0, 0, 0, 0},    {1, 3, 400, 128, 256, 1, 0, 0, 0},
        {1, 1, 333, 0, 1L << 40, 0, 0, 0, 0},   {6, 8, 100, 0, 1L << 40, 0, 0, 0, 0},
        {48, 1, 400, 0, 1L << 40, 0, 0, 0, 0},  {2, 3, 250, 192, 1L << 40, 1, 0, 0, 0},
        {3, 2, 90, 64, 128, 1, 0, 0, 0},
        /* windows narrower and wider than a key block, across block and tile edges */
        {1, 3, 300, 0, 1L << 40, 0, 37, 0, 0},  {16, 3, 200, 0, 1L << 40, 0, 37, 0, 0},
        {48, 1, 400, 0, 1L << 40, 0, 100, 0, 0}, {6, 8, 100, 0, 1L << 40, 0, 16, 1, 0},
        {5, 3, 77, 0, 1L << 40, 0, 200, 1, 0},  {2, 3, 250, 192, 1L << 40, 1, 50, 0, 0},
        {1, 2, 450, 384, 1L << 40, 1, 100, 0, 0}, {16, 2, 3, 0, 1L << 40, 0, 4, 1, 0},
        /* 4 query heads per kv head (groups of 4 rows), alone, split and windowed */
        {1, 4, 300, 0, 1L << 40, 0, 0, 0, 0},   {2, 4, 250, 192, 1L << 40, 1, 0, 0, 0},
        {1, 4, 450, 384, 1L << 40, 1, 100, 0, 0}, {4, 4, 200, 0, 1L << 40, 0, 37, 1, 0},
        /* sinks alone, one far above the scores (the output shrinks toward 0) */
        {1, 3, 300, 0, 1L << 40, 0, 0, 1, 0},   {16, 3, 0, 0, 1L << 40, 0, 0, 1, 0},
        /* not causal: every key of the sequence, or a symmetric window across block and
         * tile edges, alone, split and grouped */
        {16, 3, 0, 0, 1L << 40, 0, 0, 0, 300},  {5, 3, 77, 0, 1L << 40, 0, 0, 0, 82},
        {48, 1, 0, 0, 1L << 40, 0, 0, 0, 48},   {16, 3, 0, 0, 1L << 40, 0, 37, 0, 300},
        {5, 3, 77, 0, 1L << 40, 0, 37, 0, 400}, {48, 1, 400, 0, 1L << 40, 0, 100, 0, 500},
        {6, 8, 100, 0, 1L << 40, 0, 16, 1, 130}, {4, 4, 200, 0, 1L << 40, 0, 37, 0, 260},
        {2, 3, 250, 192, 1L << 40, 1, 50, 0, 420}, {3, 2, 90, 64, 256, 1, 0, 0, 300},
        {16, 2, 3, 0, 1L << 40, 0, 4, 1, 19},   {1, 4, 450, 384, 1L << 40, 1, 100, 0, 512},
        /* lone rows (one query head per kv head: groups of 1), split, windowed, with a sink,
         * not causal, and several tokens of them */
        {1, 1, 450, 384, 1L << 40, 1, 0, 0, 0}, {1, 1, 450, 128, 384, 1, 100, 0, 0},
        {1, 1, 300, 0, 1L << 40, 0, 37, 0, 0},  {1, 1, 300, 0, 1L << 40, 0, 0, 1, 0},
        {1, 1, 0, 0, 1L << 40, 0, 37, 0, 300},  {7, 1, 200, 0, 1L << 40, 0, 50, 1, 0},
    };
    const float sink_logits[8] = {0.5f, -1.0f, 8.0f, 0.0f, 2.0f, -3.0f, 1.0f, 30.0f};
    for (int kvt = DS4N_KV_F32; kvt <= DS4N_KV_Q8_0; kvt++) {
        for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
            const int R = cases[c].n_tok * cases[c].G;
            float w = 0.0f; /* this case */
            float *q = malloc(sizeof(float) * R * hd);
            float *o1 = calloc((size_t)R * hd, sizeof(float));
            float *o2 = calloc((size_t)R * hd, sizeof(float));
            float m1[64], l1[64], m2[64], l2[64];
            for (int i = 0; i < R * hd; i++) q[i] = frand() * 0.5f;
            ds4n_attn_job j = {.q = q, .q_stride = (int64_t)cases[c].G * hd, .o = o1,
                               .o_stride = (int64_t)cases[c].G * hd, .n_tok = cases[c].n_tok,
                               .n_group = cases[c].G, .head_dim = hd, .pos0 = cases[c].pos0,
                               .k = kt[kvt], .v = vt[kvt], .kv_type = kvt,
                               .k0 = cases[c].k0, .k1 = cases[c].k1,
                               .window = cases[c].window, .keys_end = cases[c].keys_end,
                               .sinks = cases[c].sinks ? sink_logits : NULL};
            if (cases[c].split) { j.m = m1; j.l = l1; }
            ds4n_attn_scalar(&j, scratch);
            if (!cases[c].split)
                for (int r = 0; r < R; r++) {
                    double ref[64];
                    naive(&j, r, ref);
                    const float *got = o1 + (r / cases[c].G) * j.o_stride + (r % cases[c].G) * hd;
                    for (int d = 0; d < hd; d++) w = fmaxf(w, (float)fabs(got[d] - ref[d]));
                }
            j.o = o2;
            if (cases[c].split) { j.m = m2; j.l = l2; }
            set->attn(&j, scratch);
            for (int i = 0; i < R * hd; i++) w = fmaxf(w, fabsf(o1[i] - o2[i]));
            /* Each token's rows alone (a decode step: other groups, for one head per kv head
             * a group of 1) are bitwise its rows in the whole job. */
            if (!cases[c].split && cases[c].n_tok > 1)
                for (int t = 0; t < cases[c].n_tok; t++) {
                    float *o3 = calloc((size_t)cases[c].G * hd, sizeof(float));
                    ds4n_attn_job one = j;
                    one.q = q + t * j.q_stride;
                    one.o = o3;
                    one.n_tok = 1;
                    one.pos0 = cases[c].pos0 + t;
                    set->attn(&one, scratch);
                    if (memcmp(o3, o2 + t * j.o_stride, sizeof(float) * cases[c].G * hd) != 0)
                        *row_mismatch += 1;
                    free(o3);
                }
            if (cases[c].split)
                for (int r = 0; r < R; r++) {
                    if (m1[r] != m2[r] && fabsf(m1[r] - m2[r]) > 1e-5f) w = fmaxf(w, 1.0f);
                    w = fmaxf(w, fabsf(l1[r] - l2[r]) / fmaxf(1.0f, l1[r]));
                }
            free(q); free(o1); free(o2);
            worst = fmaxf(worst, w);
            worst_type[kvt] = fmaxf(worst_type[kvt], w);
        }
    }
    printf("%s attention over f32 / f16 / q8_0 KV: max |diff| %.3g / %.3g / %.3g; a token's "
           "rows alone not bitwise its rows in the job: %d\n",
           set->name, worst_type[0], worst_type[1], worst_type[2], *row_mismatch);
    free(scratch);
    /* SwiGLU over a range that reaches both saturated ends of the sigmoid. */
    enum { NG = 1003 };
    float g1[NG], g2[NG], u[NG];
    for (int i = 0; i < NG; i++) {
        g1[i] = g2[i] = (i - NG / 2) * 0.2f;
        u[i] = frand();
    }
    ds4n_swiglu_scalar(g1, u, NG);
    set->swiglu(g2, u, NG);
    for (int i = 0; i < NG; i++)
        worst = fmaxf(worst, fabsf(g1[i] - g2[i]) / fmaxf(1.0f, fabsf(g1[i])));
    /* GeGLU the same way, and its scalar kernel against the definition in double. */
    for (int i = 0; i < NG; i++) g1[i] = g2[i] = (i - NG / 2) * 0.02f;
    ds4n_geglu_scalar(g1, u, NG);
    set->geglu(g2, u, NG);
    for (int i = 0; i < NG; i++) {
        const double x = (i - NG / 2) * 0.02f;
        const double inner = sqrt(2.0 / 3.14159265358979323846) * (x + 0.044715 * x * x * x);
        const double ref = 0.5 * x * (1.0 + tanh(inner)) * u[i];
        worst = fmaxf(worst, fabsf(g1[i] - g2[i]) / fmaxf(1.0f, fabsf(g1[i])));
        worst = fmaxf(worst, (float)fabs(g1[i] - ref) / fmaxf(1.0f, (float)fabs(ref)));
    }
    printf("%s attention (scalar also vs the definition) SwiGLU and GeGLU SIMD vs scalar:"
           " max |diff| %.3g\n", set->name, worst);
    return worst;
}

int main(void) {
    srand(7);
    const int hd = 64, n_ctx = 512;
    float *k = malloc(sizeof(float) * n_ctx * hd), *v = malloc(sizeof(float) * n_ctx * hd);
    for (int i = 0; i < n_ctx * hd; i++) {
        k[i] = frand() * 2.0f; /* spread scores so the softmax is far from uniform */
        v[i] = frand();
    }
    /* The same keys and values stored as f16 and q8_0 (K in tiles, V in rows). */
    void *kt[3] = {k}, *vt[3] = {v};
    for (int t = DS4N_KV_F16; t <= DS4N_KV_Q8_0; t++) {
        const long row = (long)ds4n_kv_row_bytes(t, hd);
        kt[t] = calloc((size_t)n_ctx, (size_t)row);
        vt[t] = calloc((size_t)n_ctx, (size_t)row);
        for (long p = 0; p < n_ctx; p++) {
            float krow[64];
            for (int d = 0; d < hd; d++)
                krow[d] = k[(p / DS4N_KT) * hd * DS4N_KT + d * DS4N_KT + p % DS4N_KT];
            ds4n_kv_tile_store(t, krow, hd, (char *)kt[t] + p / DS4N_KT * DS4N_KT * row,
                               (int)(p % DS4N_KT));
            ds4n_kv_pack_row(t, v + p * hd, hd, (char *)vt[t] + p * row);
        }
    }
    int failed = 0;
    for (size_t i = 0; i < sizeof SETS / sizeof *SETS; i++) {
        if (!cpu_runs(SETS[i].name)) {
            printf("%s: not run by this CPU\n", SETS[i].name);
            continue;
        }
        int row_mismatch = 0;
        failed |= !(check_set(&SETS[i], hd, kt, vt, &row_mismatch) < 1e-4f) || row_mismatch;
    }
    for (int t = 0; t < 3; t++) {
        free(kt[t]);
        free(vt[t]);
    }
    return failed;
}
