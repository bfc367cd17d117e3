/* Portable attention kernel (the reference the SIMD kernels are checked against) and the
 * run-time dispatch. See attention.h for the job and cache layout. */
#include "attention.h"

#include <math.h>
#include <string.h>

#include "ds4n.h"
#include "quants.h"

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

/* ---- KV element types ----------------------------------------------------------------- */

uint16_t ds4n_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    const uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) /* inf, or nan kept quiet with its top payload bits */
        return sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 | ((ax >> 13) & 0x3ff) : 0);
    if (ax >= 0x477ff000u) return sign | 0x7c00; /* 65520 and above round to inf */
    if (ax < 0x38800000u) {                      /* below 2^-14: a subnormal half or zero */
        if (ax < 0x33000000u) return sign;       /* at most 2^-25: rounds to (even) zero */
        const uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u;
        const int shift = 126 - (int)e; /* units of 2^-24, 14..24 */
        uint32_t r = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return sign | (uint16_t)r;
    }
    uint32_t h = (ax - 0x38000000u) >> 13; /* exponent rebiased by -112, mantissa cut to 10 */
    const uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++; /* a carry into the exponent is right */
    return sign | (uint16_t)h;
}

void ds4n_f32_to_f16_n(const float *x, int n, uint16_t *h, int64_t stride) {
#if defined(__x86_64__) || defined(_M_X64)
    if (ds4n_simd_level() >= DS4N_SIMD_AVX2) {
        ds4n_f32_to_f16_n_avx2(x, n, h, stride);
        return;
    }
#endif
    for (int i = 0; i < n; i++) h[i * stride] = ds4n_f32_to_f16(x[i]);
}

void ds4n_kv_quant_block(const float *x, uint16_t *d, int8_t *q, int q_stride) {
    float amax = 0.0f;
    for (int i = 0; i < DS4N_KV_QK; i++) amax = fmaxf(amax, fabsf(x[i]));
    const float scale = amax / 127.0f, inv = scale != 0.0f ? 1.0f / scale : 0.0f;
    *d = ds4n_f32_to_f16(scale);
    /* fmaxf/fminf also turn a nan into a bound, so the conversion is always defined. */
    for (int i = 0; i < DS4N_KV_QK; i++)
        q[i * q_stride] = (int8_t)roundf(fminf(fmaxf(x[i] * inv, -127.0f), 127.0f));
}

/* A q8_0 block of a K tile: [DS4N_KT] half scales then [32][DS4N_KT] int8. */
static inline char *tile_block(void *tile, int b) {
    return (char *)tile + (int64_t)b * DS4N_KT * DS4N_KV_QB;
}

void ds4n_kv_pack_row(int type, const float *x, int hd, void *row) {
    if (type == DS4N_KV_F32) {
        memcpy(row, x, sizeof(float) * hd);
    } else if (type == DS4N_KV_F16) {
        ds4n_f32_to_f16_n(x, hd, row, 1);
    } else {
        for (int b = 0; b < hd / DS4N_KV_QK; b++) {
            char *blk = (char *)row + (int64_t)b * DS4N_KV_QB;
            ds4n_kv_quant_block(x + b * DS4N_KV_QK, (uint16_t *)blk, (int8_t *)(blk + 2), 1);
        }
    }
}

void ds4n_kv_tile_store(int type, const float *x, int hd, void *tile, int lane) {
    if (type == DS4N_KV_F32) {
        float *t = tile;
        for (int d = 0; d < hd; d++) t[(int64_t)d * DS4N_KT + lane] = x[d];
    } else if (type == DS4N_KV_F16) {
        ds4n_f32_to_f16_n(x, hd, (uint16_t *)tile + lane, DS4N_KT);
    } else {
        for (int b = 0; b < hd / DS4N_KV_QK; b++) {
            char *blk = tile_block(tile, b);
            ds4n_kv_quant_block(x + b * DS4N_KV_QK, (uint16_t *)blk + lane,
                                (int8_t *)(blk + 2 * DS4N_KT) + lane, DS4N_KT);
        }
    }
}

void ds4n_kv_tile_put(int type, const void *row, int hd, void *tile, int lane) {
    if (type == DS4N_KV_F32) {
        const float *r = row;
        float *t = tile;
        for (int d = 0; d < hd; d++) t[(int64_t)d * DS4N_KT + lane] = r[d];
    } else if (type == DS4N_KV_F16) {
        const uint16_t *r = row;
        uint16_t *t = tile;
        for (int d = 0; d < hd; d++) t[(int64_t)d * DS4N_KT + lane] = r[d];
    } else {
        for (int b = 0; b < hd / DS4N_KV_QK; b++) {
            const char *src = (const char *)row + (int64_t)b * DS4N_KV_QB;
            char *blk = tile_block(tile, b);
            memcpy((uint16_t *)blk + lane, src, 2);
            int8_t *q = (int8_t *)(blk + 2 * DS4N_KT) + lane;
            for (int i = 0; i < DS4N_KV_QK; i++) q[i * DS4N_KT] = (int8_t)src[2 + i];
        }
    }
}

void ds4n_kv_tile_get(int type, const void *tile, int lane, int hd, void *row) {
    if (type == DS4N_KV_F32) {
        const float *t = tile;
        float *r = row;
        for (int d = 0; d < hd; d++) r[d] = t[(int64_t)d * DS4N_KT + lane];
    } else if (type == DS4N_KV_F16) {
        const uint16_t *t = tile;
        uint16_t *r = row;
        for (int d = 0; d < hd; d++) r[d] = t[(int64_t)d * DS4N_KT + lane];
    } else {
        for (int b = 0; b < hd / DS4N_KV_QK; b++) {
            char *dst = (char *)row + (int64_t)b * DS4N_KV_QB;
            const char *blk = tile_block((void *)tile, b);
            memcpy(dst, (const uint16_t *)blk + lane, 2);
            const int8_t *q = (const int8_t *)(blk + 2 * DS4N_KT) + lane;
            for (int i = 0; i < DS4N_KV_QK; i++) dst[2 + i] = (char)q[i * DS4N_KT];
        }
    }
}

float ds4n_kv_row_at(int type, const void *row, int d) {
    if (type == DS4N_KV_F32) return ((const float *)row)[d];
    if (type == DS4N_KV_F16) return ds4n_f16_to_f32(((const uint16_t *)row)[d]);
    const char *blk = (const char *)row + (int64_t)(d / DS4N_KV_QK) * DS4N_KV_QB;
    return ds4n_f16_to_f32(*(const uint16_t *)blk) * (float)((const int8_t *)blk)[2 + d % DS4N_KV_QK];
}

float ds4n_kv_tile_at(int type, const void *tile, int lane, int d, int hd) {
    if (type == DS4N_KV_F32) return ((const float *)tile)[(int64_t)d * DS4N_KT + lane];
    if (type == DS4N_KV_F16)
        return ds4n_f16_to_f32(((const uint16_t *)tile)[(int64_t)d * DS4N_KT + lane]);
    const char *blk = tile_block((void *)tile, d / DS4N_KV_QK);
    const int8_t q = ((const int8_t *)(blk + 2 * DS4N_KT))[(d % DS4N_KV_QK) * DS4N_KT + lane];
    return ds4n_f16_to_f32(((const uint16_t *)blk)[lane]) * (float)q;
}

/* ---- the reference kernel --------------------------------------------------------------- */

static inline float kval(const ds4n_attn_job *j, int64_t pos, int d) {
    const int64_t tile = ds4n_kv_row_bytes(j->kv_type, j->head_dim) * DS4N_KT;
    return ds4n_kv_tile_at(j->kv_type, (const char *)j->k + pos / DS4N_KT * tile,
                           (int)(pos % DS4N_KT), d, j->head_dim);
}

void ds4n_attn_scalar(const ds4n_attn_job *j, float *scratch) {
    const int hd = j->head_dim, R = j->n_tok * j->n_group;
    const int64_t vrow = ds4n_kv_row_bytes(j->kv_type, hd);
    float *O = scratch, *s = O + (int64_t)R * hd;
    for (int r = 0; r < R; r++) {
        const int t = r / j->n_group, g = r % j->n_group;
        const int64_t pos = j->pos0 + t;
        const int64_t see = ds4n_attn_keys_hi(j, pos);
        const int64_t kend = j->k1 < see ? j->k1 : see;
        int64_t kstart = j->k0;
        if (j->window > 0 && pos - j->window + 1 > kstart)
            kstart = pos - j->window + 1;
        const float *q = j->q + t * j->q_stride + (int64_t)g * hd;
        float *o = O + (int64_t)r * hd;
        float m = -INFINITY, l = 0.0f;
        for (int d = 0; d < hd; d++) o[d] = 0.0f;
        for (int64_t kb = kstart; kb < kend; kb += DS4N_KBLOCK) {
            const int nk = kend - kb < DS4N_KBLOCK ? (int)(kend - kb) : DS4N_KBLOCK;
            float mx = m;
            for (int jj = 0; jj < nk; jj++) {
                float acc = 0.0f;
                for (int d = 0; d < hd; d++) acc += q[d] * kval(j, kb + jj, d);
                s[jj] = acc;
                mx = fmaxf(mx, acc);
            }
            const float corr = m == -INFINITY ? 0.0f : expf(m - mx);
            l *= corr;
            for (int d = 0; d < hd; d++) o[d] *= corr;
            for (int jj = 0; jj < nk; jj++) {
                const float p = expf(s[jj] - mx);
                const char *v = (const char *)j->v + (kb + jj) * vrow;
                l += p;
                for (int d = 0; d < hd; d++) o[d] += p * ds4n_kv_row_at(j->kv_type, v, d);
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
    if (ds4n_simd_level() >= DS4N_SIMD_AVX512) {
        ds4n_attn_avx512(job, scratch);
        return;
    }
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
    if (ds4n_simd_level() >= DS4N_SIMD_AVX512) {
        ds4n_swiglu_avx512(g, u, n);
        return;
    }
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
    if (ds4n_simd_level() >= DS4N_SIMD_AVX512) {
        ds4n_geglu_avx512(g, u, n);
        return;
    }
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
