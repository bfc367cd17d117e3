/* AVX-512 primitives of the attention kernel (F, BW, VL, DQ with FMA and F16C); the blocked
 * driver is attention_generic.h. A 16-key K tile is one register: up to 6 query rows against
 * it (4 accumulators each, so the FMA chains overlap), a vectorized exp for the online-softmax
 * step with the key masks in mask registers, then P·V over 64 values of the head at a time
 * (4 accumulators per row); f16 and q8_0 KV are widened
 * to floats as they are loaded, so the cache is read once per step in its stored size. Same
 * results as ds4n_attn_scalar up to float rounding. */
#include "attention.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define RG_MAX 6
#define ATTN_RG4 1 /* 32 registers: a 4-row group's 16 accumulators fit */
#define INLINE static inline __attribute__((always_inline))

/* exp(x) to about 1 ulp (Cephes polynomial); exactly 0 for x below -87.3 (and -inf). */
INLINE __m512 exp_ps(__m512 x) {
    const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_GE_OQ);
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.3f));
    __m512 fx = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    __m512i e = _mm512_slli_epi32(
        _mm512_add_epi32(_mm512_cvtps_epi32(fx), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mul_ps(keep, p, _mm512_castsi512_ps(e));
}

/* 16 keys of a K tile for dim d, widened to floats. */
INLINE __m512 k_lanes(const void *kt, int d, int t) {
    if (t == DS4N_KV_F16)
        return _mm512_cvtph_ps(
            _mm256_loadu_si256((const __m256i *)((const uint16_t *)kt + (int64_t)d * DS4N_KT)));
    return _mm512_loadu_ps((const float *)kt + (int64_t)d * DS4N_KT);
}

INLINE __m512 s8x16(const int8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

/* S[i][0..16) = Q[i] · K tile, for rg rows of Q (stride hd) and S (stride DS4N_KBLOCK).
 * Each row sums into QK_SPLIT accumulators (dims taken round-robin), added at the end, so
 * the FMA chains overlap instead of waiting on each other. q8_0: each 32-dim block's integer
 * products are summed, then scaled per key lane. */
#define QK_SPLIT 4
INLINE void qk_tile(const float *Q, int hd, const void *kt, float *S, int rg, int t) {
    __m512 acc[RG_MAX][QK_SPLIT];
    for (int i = 0; i < rg; i++)
        for (int a = 0; a < QK_SPLIT; a++) acc[i][a] = _mm512_setzero_ps();
    if (t == DS4N_KV_Q8_0) {
        for (int b = 0; b < hd / DS4N_KV_QK; b++) {
            const char *blk = (const char *)kt + (int64_t)b * DS4N_KT * DS4N_KV_QB;
            const int8_t *qs = (const int8_t *)(blk + 2 * DS4N_KT);
            __m512 part[RG_MAX][QK_SPLIT];
            for (int i = 0; i < rg; i++)
                for (int a = 0; a < QK_SPLIT; a++) part[i][a] = _mm512_setzero_ps();
            for (int d = 0; d < DS4N_KV_QK; d += QK_SPLIT)
                for (int a = 0; a < QK_SPLIT; a++) {
                    const __m512 k = s8x16(qs + (d + a) * DS4N_KT);
                    for (int i = 0; i < rg; i++)
                        part[i][a] = _mm512_fmadd_ps(
                            _mm512_set1_ps(Q[i * hd + b * DS4N_KV_QK + d + a]), k, part[i][a]);
                }
            const __m512 s = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
            for (int i = 0; i < rg; i++)
                for (int a = 0; a < QK_SPLIT; a++)
                    acc[i][a] = _mm512_fmadd_ps(part[i][a], s, acc[i][a]);
        }
    } else {
        for (int d = 0; d < hd; d += QK_SPLIT) /* hd is a multiple of 16 */
            for (int a = 0; a < QK_SPLIT; a++) {
                const __m512 k = k_lanes(kt, d + a, t);
                for (int i = 0; i < rg; i++)
                    acc[i][a] = _mm512_fmadd_ps(_mm512_set1_ps(Q[i * hd + d + a]), k, acc[i][a]);
            }
    }
    for (int i = 0; i < rg; i++)
        _mm512_storeu_ps(S + i * DS4N_KBLOCK, _mm512_add_ps(_mm512_add_ps(acc[i][0], acc[i][1]),
                                                            _mm512_add_ps(acc[i][2], acc[i][3])));
}

/* Values [c, c+16) of a V row, widened to floats (c is a multiple of 16). */
INLINE __m512 v_lanes(const char *row, int c, int t) {
    if (t == DS4N_KV_F16)
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)row + c)));
    if (t == DS4N_KV_Q8_0) {
        const char *blk = row + (int64_t)(c / DS4N_KV_QK) * DS4N_KV_QB;
        uint16_t d;
        memcpy(&d, blk, sizeof d);
        return _mm512_mul_ps(s8x16((const int8_t *)blk + 2 + c % DS4N_KV_QK),
                             _mm512_set1_ps(_cvtsh_ss(d)));
    }
    return _mm512_loadu_ps((const float *)row + c);
}

/* O[i] = O[i]*corr[i] + sum_j P[i][j] V[j] over nk keys, for rg rows: PV_SPAN values of the
 * head at a time (PV_SPAN / 16 vectors per row), so each key's V values feed that many
 * independent FMA chains per row. nc (vectors per row) is a constant in every call, so the
 * accumulators stay in registers: with a run-time count they went through memory, a
 * store-to-load chain per key. */
#define PV_SPAN 64
INLINE void pv_span(const float *P, int nk, const char *V, int64_t vrow, float *O, int hd,
                    const float *corr, int rg, int t, const int nc) {
    __m512 acc[RG_MAX][PV_SPAN / 16];
    for (int i = 0; i < rg; i++)
        for (int c = 0; c < nc; c++)
            acc[i][c] = _mm512_mul_ps(_mm512_loadu_ps(O + i * hd + 16 * c), _mm512_set1_ps(corr[i]));
    for (int jj = 0; jj < nk; jj++) {
        for (int c = 0; c < nc; c++) {
            const __m512 v = v_lanes(V + jj * vrow, 16 * c, t);
            for (int i = 0; i < rg; i++)
                acc[i][c] = _mm512_fmadd_ps(_mm512_set1_ps(P[i * DS4N_KBLOCK + jj]), v, acc[i][c]);
        }
    }
    for (int i = 0; i < rg; i++)
        for (int c = 0; c < nc; c++) _mm512_storeu_ps(O + i * hd + 16 * c, acc[i][c]);
}

INLINE void pv_tile(const float *P, int nk, const void *V, int hd, float *O,
                    const float *corr, int rg, int t) {
    const int64_t vrow = ds4n_kv_row_bytes(t, hd);
    for (int c0 = 0; c0 < hd; c0 += PV_SPAN) {
        const char *v = (const char *)V + ds4n_kv_row_bytes(t, c0);
        switch ((hd - c0 < PV_SPAN ? hd - c0 : PV_SPAN) / 16) {
        case 1: pv_span(P, nk, v, vrow, O + c0, hd, corr, rg, t, 1); break;
        case 2: pv_span(P, nk, v, vrow, O + c0, hd, corr, rg, t, 2); break;
        case 3: pv_span(P, nk, v, vrow, O + c0, hd, corr, rg, t, 3); break;
        default: pv_span(P, nk, v, vrow, O + c0, hd, corr, rg, t, 4); break;
        }
    }
}

/* One online-softmax step for one row: S row (n lanes, a multiple of 16; lanes outside
 * [lo, lim) are masked) becomes P, m/l are updated, corr receives the factor for the old
 * output. */
INLINE void softmax_step(float *s, int n, int lo, int lim, float *m, float *l, float *corr) {
    if (lim <= lo) {
        memset(s, 0, sizeof(float) * n);
        *corr = 1.0f;
        return;
    }
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512 vmax = ninf;
    for (int c = 0; c < n; c += 16) {
        __m512 x = _mm512_loadu_ps(s + c);
        if (c + 16 > lim || c < lo) {
            const __m512i idx = _mm512_add_epi32(lane, _mm512_set1_epi32(c));
            const __mmask16 keep = _mm512_cmpge_epi32_mask(idx, _mm512_set1_epi32(lo)) &
                                   _mm512_cmplt_epi32_mask(idx, _mm512_set1_epi32(lim));
            x = _mm512_mask_blend_ps(keep, ninf, x);
            _mm512_storeu_ps(s + c, x);
        }
        vmax = _mm512_max_ps(vmax, x);
    }
    const float mx = fmaxf(*m, _mm512_reduce_max_ps(vmax));
    *corr = *m == -INFINITY ? 0.0f : expf(*m - mx);
    const __m512 vm = _mm512_set1_ps(mx);
    __m512 vsum = _mm512_setzero_ps();
    for (int c = 0; c < n; c += 16) {
        const __m512 p = exp_ps(_mm512_sub_ps(_mm512_loadu_ps(s + c), vm));
        _mm512_storeu_ps(s + c, p);
        vsum = _mm512_add_ps(vsum, p);
    }
    *l = *l * *corr + _mm512_reduce_add_ps(vsum);
    *m = mx;
}

INLINE void scale_row(float *out, const float *o, float inv, int hd) {
    const __m512 v = _mm512_set1_ps(inv);
    for (int c = 0; c < hd; c += 16)
        _mm512_storeu_ps(out + c, _mm512_mul_ps(_mm512_loadu_ps(o + c), v));
}

#include "attention_generic.h"

DS4N_DEFINE_ATTN(ds4n_attn_avx512)

void ds4n_swiglu_avx512(float *g, const float *u, int64_t n) {
    int64_t i = 0;
    const __m512 one = _mm512_set1_ps(1.0f);
    for (; i + 16 <= n; i += 16) {
        const __m512 x = _mm512_loadu_ps(g + i);
        const __m512 e = exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), x));
        const __m512 y = _mm512_div_ps(x, _mm512_add_ps(one, e));
        _mm512_storeu_ps(g + i, _mm512_mul_ps(y, _mm512_loadu_ps(u + i)));
    }
    if (i < n) ds4n_swiglu_scalar(g + i, u + i, n - i);
}

/* (1 + tanh(y)) / 2 = 1 / (1 + exp(-2y)): the tanh GELU as x * sigmoid(2y). */
void ds4n_geglu_avx512(float *g, const float *u, int64_t n) {
    int64_t i = 0;
    const __m512 one = _mm512_set1_ps(1.0f), m2c = _mm512_set1_ps(-2.0f * 0.7978845608028654f);
    const __m512 a = _mm512_set1_ps(0.044715f);
    for (; i + 16 <= n; i += 16) {
        const __m512 x = _mm512_loadu_ps(g + i);
        const __m512 x3 = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
        const __m512 e = exp_ps(_mm512_mul_ps(m2c, _mm512_fmadd_ps(a, x3, x)));
        const __m512 y = _mm512_div_ps(x, _mm512_add_ps(one, e));
        _mm512_storeu_ps(g + i, _mm512_mul_ps(y, _mm512_loadu_ps(u + i)));
    }
    if (i < n) ds4n_geglu_scalar(g + i, u + i, n - i);
}
