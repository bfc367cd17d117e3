/* The decoder's KV cache (see decoder.h). */
#include "decoder.h"

#include <stdlib.h>
#include <string.h>

/* ---- KV cache ----------------------------------------------------------------------- */

int ds4n_kv_init(ds4n_kv *kv, int n_layer, int n_head_kv, int head_dim, int64_t n_ctx,
                 int type) {
    memset(kv, 0, sizeof *kv);
    const int64_t row = ds4n_kv_row_bytes(type, head_dim);
    if (n_layer <= 0 || n_head_kv <= 0 || row <= 0 || n_ctx <= 0) return -1;
    kv->n_layer = n_layer;
    kv->n_head_kv = n_head_kv;
    kv->head_dim = head_dim;
    kv->type = type;
    kv->row_bytes = row;
    kv->n_ctx = n_ctx;
    kv->n_ctx_pad = (n_ctx + DS4N_KBLOCK - 1) / DS4N_KBLOCK * DS4N_KBLOCK;
    const int64_t n = (int64_t)n_layer * n_head_kv * kv->n_ctx_pad;
    /* calloc: untouched positions stay unbacked zero pages, so RSS follows use. */
    kv->k = calloc((size_t)n, (size_t)row);
    kv->v = calloc((size_t)n, (size_t)row);
    if (!kv->k || !kv->v) {
        ds4n_kv_release(kv);
        return -1;
    }
    return 0;
}

void ds4n_kv_release(ds4n_kv *kv) {
    free(kv->k);
    free(kv->v);
    kv->k = kv->v = NULL;
}

int64_t ds4n_kv_bytes(const ds4n_kv *kv) {
    return 2 * (int64_t)kv->n_layer * kv->n_head_kv * kv->n_ctx_pad * kv->row_bytes;
}

int64_t ds4n_kv_type_row_bytes(int type, int head_dim) {
    return ds4n_kv_row_bytes(type, head_dim);
}

static int64_t head_bytes(const ds4n_kv *kv) { return kv->n_ctx_pad * kv->row_bytes; }

void *ds4n_kv_k(const ds4n_kv *kv, int il, int h) {
    return kv->k + ((int64_t)il * kv->n_head_kv + h) * head_bytes(kv);
}
void *ds4n_kv_v(const ds4n_kv *kv, int il, int h) {
    return kv->v + ((int64_t)il * kv->n_head_kv + h) * head_bytes(kv);
}

/* The K tile holding position p of a head's cache. */
static char *k_tile(const ds4n_kv *kv, int il, int h, int64_t p) {
    return (char *)ds4n_kv_k(kv, il, h) + p / DS4N_KT * DS4N_KT * kv->row_bytes;
}

void ds4n_kv_store(ds4n_kv *kv, int il, int64_t pos, const float *k, const float *v) {
    const int hd = kv->head_dim;
    for (int h = 0; h < kv->n_head_kv; h++) {
        ds4n_kv_tile_store(kv->type, k + h * hd, hd, k_tile(kv, il, h, pos), (int)(pos % DS4N_KT));
        ds4n_kv_pack_row(kv->type, v + h * hd, hd,
                         (char *)ds4n_kv_v(kv, il, h) + pos * kv->row_bytes);
    }
}

/* Rows [start, start + n) of one layer; -1 unless the layer, the side and the range are
 * inside the cache (n <= n_ctx - start, so start + n cannot overflow). */
static int kv_rows_ok(const ds4n_kv *kv, int il, int which, int64_t start, int64_t n) {
    return il >= 0 && il < kv->n_layer && (which == 0 || which == 1) && start >= 0 &&
           start <= kv->n_ctx && n >= 0 && n <= kv->n_ctx - start;
}

int ds4n_kv_get_rows(const ds4n_kv *kv, int il, int which, int64_t start, int64_t n,
                     void *dst) {
    const int64_t row = kv->row_bytes;
    if (!kv_rows_ok(kv, il, which, start, n)) return -1;
    for (int h = 0; h < kv->n_head_kv; h++) {
        char *out = (char *)dst + (int64_t)h * n * row;
        if (which == 1) {
            memcpy(out, (const char *)ds4n_kv_v(kv, il, h) + start * row, (size_t)(n * row));
            continue;
        }
        for (int64_t p = start; p < start + n; p++)
            ds4n_kv_tile_get(kv->type, k_tile(kv, il, h, p), (int)(p % DS4N_KT), kv->head_dim,
                             out + (p - start) * row);
    }
    return 0;
}

int ds4n_kv_set_rows(ds4n_kv *kv, int il, int which, int64_t start, int64_t n,
                     const void *src) {
    const int64_t row = kv->row_bytes;
    if (!kv_rows_ok(kv, il, which, start, n)) return -1;
    for (int h = 0; h < kv->n_head_kv; h++) {
        const char *in = (const char *)src + (int64_t)h * n * row;
        if (which == 1) {
            memcpy((char *)ds4n_kv_v(kv, il, h) + start * row, in, (size_t)(n * row));
            continue;
        }
        for (int64_t p = start; p < start + n; p++)
            ds4n_kv_tile_put(kv->type, in + (p - start) * row, kv->head_dim,
                             k_tile(kv, il, h, p), (int)(p % DS4N_KT));
    }
    return 0;
}

int ds4n_kv_get(const ds4n_kv *kv, int il, int which, int64_t n, void *dst) {
    return ds4n_kv_get_rows(kv, il, which, 0, n, dst);
}

int ds4n_kv_set(ds4n_kv *kv, int il, int which, int64_t n, const void *src) {
    return ds4n_kv_set_rows(kv, il, which, 0, n, src);
}
