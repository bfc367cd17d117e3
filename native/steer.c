/* Directional steering and residual capture (see steer.h). */
#include "steer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct ds4n_steer {
    int32_t n_layer, n_embd;
    float attn_scale, ffn_scale;
    float *dir;     /* n_layer x n_embd */
    float *capture; /* n_layer x n_embd, or NULL */
};

ds4n_steer *ds4n_steer_new(int32_t n_layer, int32_t n_embd, const float *dir, float attn_scale,
                           float ffn_scale, int capture) {
    if (n_layer <= 0 || n_embd <= 0 || n_layer > (1 << 16) || n_embd > (1 << 20) ||
        !isfinite(attn_scale) || !isfinite(ffn_scale))
        return NULL;
    const size_t n = (size_t)n_layer * (size_t)n_embd;
    if (dir)
        for (size_t i = 0; i < n; i++)
            if (!isfinite(dir[i])) return NULL;
    ds4n_steer *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->n_layer = n_layer;
    s->n_embd = n_embd;
    s->attn_scale = attn_scale;
    s->ffn_scale = ffn_scale;
    s->dir = calloc(n, sizeof(float));
    s->capture = capture ? calloc(n, sizeof(float)) : NULL;
    if (!s->dir || (capture && !s->capture)) {
        ds4n_steer_free(s);
        return NULL;
    }
    if (dir) memcpy(s->dir, dir, n * sizeof(float));
    return s;
}

void ds4n_steer_free(ds4n_steer *s) {
    if (!s) return;
    free(s->dir);
    free(s->capture);
    free(s);
}

int32_t ds4n_steer_n_layer(const ds4n_steer *s) { return s->n_layer; }
int32_t ds4n_steer_n_embd(const ds4n_steer *s) { return s->n_embd; }

int ds4n_steer_captured(const ds4n_steer *s, float *out) {
    if (!s->capture) return -1;
    memcpy(out, s->capture, (size_t)s->n_layer * (size_t)s->n_embd * sizeof(float));
    return 0;
}

void ds4n_steer_rows(ds4n_steer *s, int il, int where, float *rows, int64_t n) {
    if (!s || il < 0 || il >= s->n_layer || n <= 0) return;
    const int64_t E = s->n_embd;
    if (s->capture && where == DS4N_STEER_FFN)
        memcpy(s->capture + il * E, rows + (n - 1) * E, (size_t)E * sizeof(float));
    const float scale = where == DS4N_STEER_ATTN ? s->attn_scale : s->ffn_scale;
    if (scale == 0.0f) return;
    const float *d = s->dir + il * E;
    for (int64_t r = 0; r < n; r++) {
        float *x = rows + r * E;
        for (int64_t i = 0; i < E; i++) x[i] += scale * d[i];
    }
}

void ds4n_dec_residual(ds4n_dec_batch *b, int il, int where) {
    const int64_t E = b->seq[0]->dims.n_embd;
    ds4n_dec_add_rows(b->x, b->tmp, b->n_rows * E);
    for (int i = 0; i < b->n_seq; i++)
        ds4n_steer_rows(b->seq[i]->steer, il, where, b->x + b->row0[i] * E, b->count[i]);
}

int ds4n_dec_session_set_steer(ds4n_dec_session *sess, ds4n_steer *s) {
    if (s && (s->n_embd != sess->dims.n_embd || s->n_layer != sess->kv.n_layer)) return -1;
    sess->steer = s;
    return 0;
}
