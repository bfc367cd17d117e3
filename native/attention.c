/* Portable attention kernel (the reference the SIMD kernels are checked against) and the
 * run-time dispatch. See attention.h for the job and cache layout. */
#include "attention.h"

#include <math.h>

#include "ds4n.h"

#define ROW_GROUP 6 /* rows padded to a multiple of this, for the SIMD kernels' tiles */

int64_t ds4n_attn_scratch_floats(int n_rows, int head_dim) {
    int64_t rp = (n_rows + ROW_GROUP - 1) / ROW_GROUP * ROW_GROUP;
    return 2 * rp * head_dim + rp * DS4N_KBLOCK + 4 * rp + 64;
}

float ds4n_attn_norm_factor(float m, float l, const float *sink) {
    if (!sink || m == -INFINITY) return l > 0.0f ? 1.0f / l : 0.0f;
    /* o and l are relative to exp(m); the sink's exp(sink) joins l on a common max. */
    const float mx = fmaxf(m, *sink), a = expf(m - mx);
    return a / (l * a + expf(*sink - mx));
}

static inline float kval(const float *k, int64_t pos, int d, int hd) {
    return k[(pos / DS4N_KT) * hd * DS4N_KT + (int64_t)d * DS4N_KT + pos % DS4N_KT];
}

void ds4n_attn_scalar(const ds4n_attn_job *j, float *scratch) {
    const int hd = j->head_dim, R = j->n_tok * j->n_group;
    float *O = scratch, *s = O + (int64_t)R * hd;
    for (int r = 0; r < R; r++) {
        const int t = r / j->n_group, g = r % j->n_group;
        const int64_t pos = j->pos0 + t;
        const int64_t kend = j->k1 < pos + 1 ? j->k1 : pos + 1;
        int64_t kstart = j->k0;
        if (j->window > 0 && pos - j->window + 1 > kstart) kstart = pos - j->window + 1;
        const float *q = j->q + t * j->q_stride + (int64_t)g * hd;
        float *o = O + (int64_t)r * hd;
        float m = -INFINITY, l = 0.0f;
        for (int d = 0; d < hd; d++) o[d] = 0.0f;
        for (int64_t kb = kstart; kb < kend; kb += DS4N_KBLOCK) {
            const int nk = kend - kb < DS4N_KBLOCK ? (int)(kend - kb) : DS4N_KBLOCK;
            float mx = m;
            for (int jj = 0; jj < nk; jj++) {
                float acc = 0.0f;
                for (int d = 0; d < hd; d++) acc += q[d] * kval(j->k, kb + jj, d, hd);
                s[jj] = acc;
                mx = fmaxf(mx, acc);
            }
            const float corr = m == -INFINITY ? 0.0f : expf(m - mx);
            l *= corr;
            for (int d = 0; d < hd; d++) o[d] *= corr;
            for (int jj = 0; jj < nk; jj++) {
                const float p = expf(s[jj] - mx);
                const float *v = j->v + (kb + jj) * hd;
                l += p;
                for (int d = 0; d < hd; d++) o[d] += p * v[d];
            }
            m = mx;
        }
        float *out = j->o + t * j->o_stride + (int64_t)g * hd;
        if (j->m) {
            j->m[r] = m;
            j->l[r] = l;
            for (int d = 0; d < hd; d++) out[d] = o[d];
        } else {
            const float inv = ds4n_attn_norm_factor(m, l, j->sinks ? j->sinks + g : NULL);
            for (int d = 0; d < hd; d++) out[d] = o[d] * inv;
        }
    }
}

void ds4n_attn_run(const ds4n_attn_job *job, float *scratch) {
#if defined(__x86_64__) || defined(_M_X64)
    if (ds4n_simd_level() == DS4N_SIMD_AVX2) {
        ds4n_attn_avx2(job, scratch);
        return;
    }
#endif
#if defined(__aarch64__)
    if (ds4n_simd_level() == DS4N_SIMD_NEON) {
        ds4n_attn_neon(job, scratch);
        return;
    }
#endif
    ds4n_attn_scalar(job, scratch);
}

void ds4n_swiglu_scalar(float *g, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

void ds4n_swiglu(float *g, const float *u, int64_t n) {
#if defined(__x86_64__) || defined(_M_X64)
    if (ds4n_simd_level() == DS4N_SIMD_AVX2) {
        ds4n_swiglu_avx2(g, u, n);
        return;
    }
#endif
#if defined(__aarch64__)
    if (ds4n_simd_level() == DS4N_SIMD_NEON) {
        ds4n_swiglu_neon(g, u, n);
        return;
    }
#endif
    ds4n_swiglu_scalar(g, u, n);
}

/* gelu(x) = x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))). */
#define GELU_C 0.7978845608028654f
#define GELU_A 0.044715f

void ds4n_geglu_scalar(float *g, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float x = g[i];
        g[i] = 0.5f * x * (1.0f + tanhf(GELU_C * (x + GELU_A * x * x * x))) * u[i];
    }
}

void ds4n_geglu(float *g, const float *u, int64_t n) {
#if defined(__x86_64__) || defined(_M_X64)
    if (ds4n_simd_level() == DS4N_SIMD_AVX2) {
        ds4n_geglu_avx2(g, u, n);
        return;
    }
#endif
#if defined(__aarch64__)
    if (ds4n_simd_level() == DS4N_SIMD_NEON) {
        ds4n_geglu_neon(g, u, n);
        return;
    }
#endif
    ds4n_geglu_scalar(g, u, n);
}
