/* Checks the SIMD attention and SwiGLU kernels against the scalar ones on random jobs:
 * prefill blocks, decode rows, split key ranges, grouped heads of several sizes. Built and run by
 * tests/test_llama_forward.py (natively for AVX2, under qemu for NEON).
 * Prints the largest difference; exits 1 when it exceeds the bound. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "attention.h"
#include "ds4n.h"

int ds4n_simd_level(void) { return 0; } /* the kernels are called directly */

#if defined(__aarch64__)
#define SIMD ds4n_attn_neon
#define SWIGLU ds4n_swiglu_neon
#else
#define SIMD ds4n_attn_avx2
#define SWIGLU ds4n_swiglu_avx2
#endif

static float frand(void) { return (float)rand() / RAND_MAX * 2.0f - 1.0f; }

int main(void) {
    srand(7);
    const int hd = 64, n_ctx = 512;
    float *k = malloc(sizeof(float) * n_ctx * hd), *v = malloc(sizeof(float) * n_ctx * hd);
    for (int i = 0; i < n_ctx * hd; i++) {
        k[i] = frand() * 2.0f; /* spread scores so the softmax is far from uniform */
        v[i] = frand();
    }
    float *scratch = malloc(sizeof(float) * ds4n_attn_scratch_floats(64, hd));
    float worst = 0.0f;
    const struct { int n_tok, G; long pos0, k0, k1; int split; } cases[] = {
        {1, 3, 0, 0, 1L << 40, 0},     {1, 3, 300, 0, 1L << 40, 0},  {16, 3, 0, 0, 1L << 40, 0},
        {16, 3, 200, 0, 1L << 40, 0},  {5, 3, 77, 0, 1L << 40, 0},   {1, 3, 400, 128, 256, 1},
        {1, 1, 333, 0, 1L << 40, 0},   {6, 8, 100, 0, 1L << 40, 0},  {48, 1, 400, 0, 1L << 40, 0},
        {2, 3, 250, 192, 1L << 40, 1}, {3, 2, 90, 64, 128, 1},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        const int R = cases[c].n_tok * cases[c].G;
        float *q = malloc(sizeof(float) * R * hd);
        float *o1 = calloc((size_t)R * hd, sizeof(float));
        float *o2 = calloc((size_t)R * hd, sizeof(float));
        float m1[64], l1[64], m2[64], l2[64];
        for (int i = 0; i < R * hd; i++) q[i] = frand() * 0.5f;
        ds4n_attn_job j = {.q = q, .q_stride = (int64_t)cases[c].G * hd, .o = o1,
                           .o_stride = (int64_t)cases[c].G * hd, .n_tok = cases[c].n_tok,
                           .n_group = cases[c].G, .head_dim = hd, .pos0 = cases[c].pos0,
                           .k = k, .v = v, .k0 = cases[c].k0, .k1 = cases[c].k1};
        if (cases[c].split) { j.m = m1; j.l = l1; }
        ds4n_attn_scalar(&j, scratch);
        j.o = o2;
        if (cases[c].split) { j.m = m2; j.l = l2; }
        SIMD(&j, scratch);
        for (int i = 0; i < R * hd; i++) worst = fmaxf(worst, fabsf(o1[i] - o2[i]));
        if (cases[c].split)
            for (int r = 0; r < R; r++) {
                if (m1[r] != m2[r] && fabsf(m1[r] - m2[r]) > 1e-5f) worst = fmaxf(worst, 1.0f);
                worst = fmaxf(worst, fabsf(l1[r] - l2[r]) / fmaxf(1.0f, l1[r]));
            }
        free(q); free(o1); free(o2);
    }
    /* SwiGLU over a range that reaches both saturated ends of the sigmoid. */
    enum { NG = 1003 };
    float g1[NG], g2[NG], u[NG];
    for (int i = 0; i < NG; i++) {
        g1[i] = g2[i] = (i - NG / 2) * 0.2f;
        u[i] = frand();
    }
    ds4n_swiglu_scalar(g1, u, NG);
    SWIGLU(g2, u, NG);
    for (int i = 0; i < NG; i++)
        worst = fmaxf(worst, fabsf(g1[i] - g2[i]) / fmaxf(1.0f, fabsf(g1[i])));
    printf("attention and SwiGLU SIMD vs scalar: max |diff| %.3g\n", worst);
    return worst < 1e-4f ? 0 : 1;
}
