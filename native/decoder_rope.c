/* RoPE of the decoder families (see decoder.h): tables and rotation, on the calling thread. */
#include "decoder.h"

#include <math.h>
#include <string.h>

/* ---- RoPE --------------------------------------------------------------------------- */

/* The pair index where YaRN's ramp starts or ends for a rotation count (llama.cpp). */
static float yarn_corr_dim(int n_rot, int n_ctx_orig, float rotations, float base) {
    return n_rot * logf(n_ctx_orig / (rotations * 2 * (float)M_PI)) / (2 * logf(base));
}

int ds4n_rope_init(ds4n_rope *r, const ds4n_rope_params *p) {
    memset(r, 0, sizeof *r);
    if (p->n_rot <= 0 || p->n_rot % 2 || p->n_rot > DS4N_ROPE_MAX_DIMS || !(p->base > 0.0f) ||
        !(p->freq_scale > 0.0f) || (p->mode != DS4N_ROPE_NORMAL && p->mode != DS4N_ROPE_NEOX))
        return -1;
    r->n_rot = p->n_rot;
    r->mode = p->mode;
    r->mscale = p->attn_factor > 0.0f ? p->attn_factor : 1.0f;
    float lo = 0.0f, hi = 0.0f;
    const int yarn = p->ext_factor > 0.0f;
    if (yarn) {
        if (p->n_ctx_orig <= 0 || !(p->beta_fast > 0.0f) || !(p->beta_slow > 0.0f)) return -1;
        lo = yarn_corr_dim(p->n_rot, p->n_ctx_orig, p->beta_fast, p->base);
        hi = yarn_corr_dim(p->n_rot, p->n_ctx_orig, p->beta_slow, p->base);
        if (!p->yarn_exact_range) {
            lo = floorf(lo);
            hi = ceilf(hi);
        }
        lo = fmaxf(0.0f, lo);
        hi = fminf(p->n_rot - 1, hi);
        r->mscale *= 1.0f + 0.1f * logf(1.0f / p->freq_scale);
    }
    for (int i = 0; i < p->n_rot / 2; i++) {
        double f = pow((double)p->base, -2.0 * i / p->n_rot);
        if (yarn) {
            /* Blend of the interpolated (scaled) and the extrapolated (unscaled) rate: the
             * angle is linear in both, so the blend is one rate per pair. */
            if (p->freq_factors) f /= p->freq_factors[i];
            const float y = (i - lo) / fmaxf(0.001f, hi - lo);
            const double mix = (1.0f - fminf(1.0f, fmaxf(0.0f, y))) * p->ext_factor;
            f = f * p->freq_scale * (1.0 - mix) + f * mix;
        } else {
            f *= p->freq_scale;
            if (p->freq_factors) f /= p->freq_factors[i];
        }
        r->inv_freq[i] = (float)f;
    }
    return 0;
}

void ds4n_rope_table(const ds4n_rope *r, int64_t pos0, int64_t T, float *cs) {
    const int half = r->n_rot / 2;
    /* Angles in double: positions reach 10^5 radians and beyond. */
    for (int64_t t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            const double a = (double)(pos0 + t) * r->inv_freq[i];
            float c = (float)cos(a), s = (float)sin(a);
            if (r->mscale != 1.0f) {
                c *= r->mscale;
                s *= r->mscale;
            }
            cs[t * r->n_rot + 2 * i] = c;
            cs[t * r->n_rot + 2 * i + 1] = s;
        }
}

void ds4n_rope_apply(const ds4n_rope *r, float *x, const float *cs, int n_heads, int hd,
                     float scale) {
    const int half = r->n_rot / 2;
    /* NORMAL rotates (x[2i], x[2i+1]); NEOX rotates (x[i], x[i + n_rot/2]). */
    const int neox = r->mode == DS4N_ROPE_NEOX;
    const int stride = neox ? 1 : 2, other = neox ? half : 1;
    for (int h = 0; h < n_heads; h++) {
        float *xh = x + (int64_t)h * hd;
        for (int i = 0; i < half; i++) {
            const float c = cs[2 * i], sn = cs[2 * i + 1];
            float *pa = xh + i * stride, *pb = pa + other;
            const float a = *pa, b = *pb;
            *pa = (a * c - b * sn) * scale;
            *pb = (a * sn + b * c) * scale;
        }
        if (scale != 1.0f)
            for (int i = r->n_rot; i < hd; i++) xh[i] *= scale;
    }
}
