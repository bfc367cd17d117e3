/* AVX2+FMA+F16C primitives of the attention kernel; the blocked driver is
 * attention_generic.h. Up to 6 query rows against 16-key K tiles (12 accumulators), a
 * vectorized exp for the online-softmax step, then P·V; f16 and q8_0 KV are widened to
 * floats as they are loaded, so the cache is read once per step in its stored size. Same
 * results as ds4n_attn_scalar up to float rounding. */
#include "attention.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define RG_MAX 6
#define INLINE static inline __attribute__((always_inline))

/* exp(x) to about 1 ulp (Cephes polynomial); exactly 0 for x below -87.3 (and -inf). */
INLINE __m256 exp_ps(__m256 x) {
    const __m256 zero_below = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_GE_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
    __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), zero_below);
}

INLINE float hmax_ps(__m256 v) {
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    x = _mm_max_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

INLINE float hsum_ps(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

/* 16 keys of a K tile for dim d, widened to floats. */
INLINE void k_lanes(const void *kt, int d, int t, __m256 *k0, __m256 *k1) {
    if (t == DS4N_KV_F16) {
        const __m128i *h = (const __m128i *)((const uint16_t *)kt + (int64_t)d * DS4N_KT);
        *k0 = _mm256_cvtph_ps(_mm_loadu_si128(h));
        *k1 = _mm256_cvtph_ps(_mm_loadu_si128(h + 1));
    } else {
        *k0 = _mm256_loadu_ps((const float *)kt + (int64_t)d * DS4N_KT);
        *k1 = _mm256_loadu_ps((const float *)kt + (int64_t)d * DS4N_KT + 8);
    }
}

/* S[i][0..16) = Q[i] · K tile, for rg rows of Q (stride hd) and S (stride DS4N_KBLOCK).
 * q8_0: each 32-dim block's integer products are summed, then scaled per key lane. */
INLINE void qk_tile(const float *Q, int hd, const void *kt, float *S, int rg, int t) {
    __m256 acc[RG_MAX][2];
    for (int i = 0; i < rg; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    if (t == DS4N_KV_Q8_0) {
        for (int b = 0; b < hd / DS4N_KV_QK; b++) {
            const char *blk = (const char *)kt + (int64_t)b * DS4N_KT * DS4N_KV_QB;
            const int8_t *qs = (const int8_t *)(blk + 2 * DS4N_KT);
            __m256 part[RG_MAX][2];
            for (int i = 0; i < rg; i++) part[i][0] = part[i][1] = _mm256_setzero_ps();
            for (int d = 0; d < DS4N_KV_QK; d++) {
                const __m128i q = _mm_loadu_si128((const __m128i *)(qs + d * DS4N_KT));
                const __m256 k0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
                const __m256 k1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8)));
                for (int i = 0; i < rg; i++) {
                    const __m256 qb = _mm256_broadcast_ss(Q + i * hd + b * DS4N_KV_QK + d);
                    part[i][0] = _mm256_fmadd_ps(qb, k0, part[i][0]);
                    part[i][1] = _mm256_fmadd_ps(qb, k1, part[i][1]);
                }
            }
            const __m256 s0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk));
            const __m256 s1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk + 1));
            for (int i = 0; i < rg; i++) {
                acc[i][0] = _mm256_fmadd_ps(part[i][0], s0, acc[i][0]);
                acc[i][1] = _mm256_fmadd_ps(part[i][1], s1, acc[i][1]);
            }
        }
    } else {
        for (int d = 0; d < hd; d++) {
            __m256 k0, k1;
            k_lanes(kt, d, t, &k0, &k1);
            for (int i = 0; i < rg; i++) {
                const __m256 qb = _mm256_broadcast_ss(Q + i * hd + d);
                acc[i][0] = _mm256_fmadd_ps(qb, k0, acc[i][0]);
                acc[i][1] = _mm256_fmadd_ps(qb, k1, acc[i][1]);
            }
        }
    }
    for (int i = 0; i < rg; i++) {
        _mm256_storeu_ps(S + i * DS4N_KBLOCK, acc[i][0]);
        _mm256_storeu_ps(S + i * DS4N_KBLOCK + 8, acc[i][1]);
    }
}

/* Values [c, c+16) of a V row, widened to floats (c is a multiple of 16). */
INLINE void v_lanes(const char *row, int c, int t, __m256 *v0, __m256 *v1) {
    if (t == DS4N_KV_F16) {
        const __m128i *h = (const __m128i *)((const uint16_t *)row + c);
        *v0 = _mm256_cvtph_ps(_mm_loadu_si128(h));
        *v1 = _mm256_cvtph_ps(_mm_loadu_si128(h + 1));
    } else if (t == DS4N_KV_Q8_0) {
        const char *blk = row + (int64_t)(c / DS4N_KV_QK) * DS4N_KV_QB;
        uint16_t d;
        memcpy(&d, blk, sizeof d);
        const __m256 sc = _mm256_set1_ps(_cvtsh_ss(d));
        const __m128i q = _mm_loadu_si128((const __m128i *)(blk + 2 + c % DS4N_KV_QK));
        *v0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), sc);
        *v1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8))), sc);
    } else {
        *v0 = _mm256_loadu_ps((const float *)row + c);
        *v1 = _mm256_loadu_ps((const float *)row + c + 8);
    }
}

/* O[i] = O[i]*corr[i] + sum_j P[i][j] V[j] over nk keys, for rg rows. */
INLINE void pv_tile(const float *P, int nk, const void *V, int hd, float *O,
                    const float *corr, int rg, int t) {
    const int64_t vrow = ds4n_kv_row_bytes(t, hd);
    for (int c = 0; c < hd; c += 16) {
        __m256 acc[RG_MAX][2];
        for (int i = 0; i < rg; i++) {
            const __m256 cb = _mm256_broadcast_ss(corr + i);
            acc[i][0] = _mm256_mul_ps(_mm256_loadu_ps(O + i * hd + c), cb);
            acc[i][1] = _mm256_mul_ps(_mm256_loadu_ps(O + i * hd + c + 8), cb);
        }
        for (int jj = 0; jj < nk; jj++) {
            __m256 v0, v1;
            v_lanes((const char *)V + jj * vrow, c, t, &v0, &v1);
            for (int i = 0; i < rg; i++) {
                const __m256 pb = _mm256_broadcast_ss(P + i * DS4N_KBLOCK + jj);
                acc[i][0] = _mm256_fmadd_ps(pb, v0, acc[i][0]);
                acc[i][1] = _mm256_fmadd_ps(pb, v1, acc[i][1]);
            }
        }
        for (int i = 0; i < rg; i++) {
            _mm256_storeu_ps(O + i * hd + c, acc[i][0]);
            _mm256_storeu_ps(O + i * hd + c + 8, acc[i][1]);
        }
    }
}

/* One online-softmax step for one row: S row (n lanes, a multiple of 8; lanes outside
 * [lo, lim) are masked) becomes P, m/l are updated, corr receives the factor for the old
 * output. */
INLINE void softmax_step(float *s, int n, int lo, int lim, float *m, float *l, float *corr) {
    if (lim <= lo) {
        memset(s, 0, sizeof(float) * n);
        *corr = 1.0f;
        return;
    }
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256 vmax = ninf;
    for (int c = 0; c < n; c += 8) {
        __m256 x = _mm256_loadu_ps(s + c);
        if (c + 8 > lim || c < lo) {
            const __m256i idx = _mm256_add_epi32(lane, _mm256_set1_epi32(c));
            const __m256i below = _mm256_cmpgt_epi32(_mm256_set1_epi32(lo), idx);
            const __m256 keep = _mm256_castsi256_ps(_mm256_andnot_si256(
                below, _mm256_cmpgt_epi32(_mm256_set1_epi32(lim), idx)));
            x = _mm256_blendv_ps(ninf, x, keep);
            _mm256_storeu_ps(s + c, x);
        }
        vmax = _mm256_max_ps(vmax, x);
    }
    const float mx = fmaxf(*m, hmax_ps(vmax));
    *corr = *m == -INFINITY ? 0.0f : expf(*m - mx);
    const __m256 vm = _mm256_set1_ps(mx);
    __m256 vsum = _mm256_setzero_ps();
    for (int c = 0; c < n; c += 8) {
        const __m256 p = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(s + c), vm));
        _mm256_storeu_ps(s + c, p);
        vsum = _mm256_add_ps(vsum, p);
    }
    *l = *l * *corr + hsum_ps(vsum);
    *m = mx;
}

INLINE void scale_row(float *out, const float *o, float inv, int hd) {
    const __m256 v = _mm256_set1_ps(inv);
    for (int c = 0; c < hd; c += 8)
        _mm256_storeu_ps(out + c, _mm256_mul_ps(_mm256_loadu_ps(o + c), v));
}

#include "attention_generic.h"

DS4N_DEFINE_ATTN(ds4n_attn_avx2)

void ds4n_swiglu_avx2(float *g, const float *u, int64_t n) {
    int64_t i = 0;
    const __m256 one = _mm256_set1_ps(1.0f);
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(g + i);
        const __m256 e = exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), x));
        const __m256 y = _mm256_div_ps(x, _mm256_add_ps(one, e));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(y, _mm256_loadu_ps(u + i)));
    }
    for (; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* (1 + tanh(y)) / 2 = 1 / (1 + exp(-2y)): the tanh GELU as x * sigmoid(2y). */
void ds4n_geglu_avx2(float *g, const float *u, int64_t n) {
    int64_t i = 0;
    const __m256 one = _mm256_set1_ps(1.0f), m2c = _mm256_set1_ps(-2.0f * 0.7978845608028654f);
    const __m256 a = _mm256_set1_ps(0.044715f);
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(g + i);
        const __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
        const __m256 e = exp_ps(_mm256_mul_ps(m2c, _mm256_fmadd_ps(a, x3, x)));
        const __m256 y = _mm256_div_ps(x, _mm256_add_ps(one, e));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(y, _mm256_loadu_ps(u + i)));
    }
    if (i < n) ds4n_geglu_scalar(g + i, u + i, n - i);
}

void ds4n_f32_to_f16_n_avx2(const float *x, int n, uint16_t *h, int64_t stride) {
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m128i v = _mm256_cvtps_ph(_mm256_loadu_ps(x + i),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        if (stride == 1) {
            _mm_storeu_si128((__m128i *)(h + i), v);
            continue;
        }
        uint16_t b[8];
        _mm_storeu_si128((__m128i *)b, v);
        for (int j = 0; j < 8; j++) h[(i + j) * stride] = b[j];
    }
    for (; i < n; i++) h[i * stride] = ds4n_f32_to_f16(x[i]);
}
