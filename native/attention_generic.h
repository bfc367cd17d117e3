/* The blocked attention driver shared by the SIMD kernels (see attention.h for the job
 * and the cache layout). Query rows are taken in groups of rg (3 or 6) against 16-key K
 * tiles, then one online-softmax step per 64-key block, then P·V for the same group.
 *
 * The including file defines INLINE, RG_MAX and its vector primitives, each reading K and V
 * in the KV element type t (a constant in every call, so each type inlines specialised):
 *   qk_tile(Q, hd, kt, S, rg, t)             S[i][0..16) = Q[i] · K tile, rg rows
 *   softmax_step(s, n, lo, lim, m, l, corr)  one row's online-softmax step
 *   pv_tile(P, nk, V, hd, O, corr, rg, t)    O[i] = O[i]*corr[i] + P[i] · V
 *   scale_row(out, o, inv, hd)               out = o * inv
 * then instantiates the entry point with DS4N_DEFINE_ATTN(name). */
#ifndef DS4N_ATTENTION_GENERIC_H
#define DS4N_ATTENTION_GENERIC_H

#include <math.h>
#include <string.h>

#include "attention.h"
#include "prefetch.h"

INLINE void attend(const ds4n_attn_job *j, float *scratch, int rg, int kvt) {
    const int hd = j->head_dim, G = j->n_group, R = j->n_tok * G;
    const int64_t vrow = ds4n_kv_row_bytes(kvt, hd), ktile = vrow * DS4N_KT;
    const char *K = j->k, *V = j->v;
    const int Rp = (R + rg - 1) / rg * rg;
    float *Q = scratch, *O = Q + (int64_t)Rp * hd, *S = O + (int64_t)Rp * hd;
    float *m = S + (int64_t)Rp * DS4N_KBLOCK, *l = m + Rp, *corr = l + Rp;
    for (int r = 0; r < Rp; r++) {
        if (r < R)
            memcpy(Q + (int64_t)r * hd, j->q + (r / G) * j->q_stride + (int64_t)(r % G) * hd,
                   sizeof(float) * hd);
        else
            memset(Q + (int64_t)r * hd, 0, sizeof(float) * hd);
        memset(O + (int64_t)r * hd, 0, sizeof(float) * hd);
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
    /* One past the last key any query sees: the last query's (ds4n_attn_keys_hi grows with
     * the position, causal or not). */
    const int64_t window = j->window;
    const int64_t last = ds4n_attn_keys_hi(j, j->pos0 + j->n_tok - 1);
    const int64_t kend = j->k1 < last ? j->k1 : last;
    /* A window: no query sees keys below the first query's window. The steps begin at a
     * multiple of DS4N_KBLOCK (k0 is one), not at the first query's window: a row's keys are
     * then grouped into online-softmax steps at the same boundaries whatever row begins its
     * job, so each row of a chunk is bitwise its decode step (a window start rounded to a
     * K tile put the boundaries 16..48 keys apart when the chunk's first row and a later row
     * rounded differently; gemma3's window of 48 in the kit, any real window). The tiles of
     * a block below every row's window are skipped (`skip`), so this costs no work. */
    int64_t kstart = j->k0;
    if (window > 0 && j->pos0 - window + 1 > kstart)
        kstart = (j->pos0 - window + 1) / DS4N_KBLOCK * DS4N_KBLOCK;
    if (kstart < j->k0) kstart = j->k0;
    for (int64_t kb = kstart; kb < kend; kb += DS4N_KBLOCK) {
        /* One step's keys are a few KB of K and of V, too short a run for the hardware
         * prefetchers to reach ahead of: the next block's are fetched while this one runs,
         * a tile's worth beside each K tile's product (all at once, the prefetches stalled
         * on the memory queue themselves), into L2 (measured as fast as L1 or faster). */
        const int64_t nkb = kb + DS4N_KBLOCK, next = kend - nkb < DS4N_KBLOCK ? kend - nkb
                                                                              : DS4N_KBLOCK;
        for (int r0 = 0; r0 < Rp; r0 += rg) {
            /* The group's last real row sees the most keys, its first the lowest ones. */
            const int rlast = (r0 + rg < R ? r0 + rg : R) - 1;
            int64_t gend = ds4n_attn_keys_hi(j, j->pos0 + rlast / G);
            if (gend > kend) gend = kend;
            if (gend > kb + DS4N_KBLOCK) gend = kb + DS4N_KBLOCK;
            const int nk = (int)(gend - kb);
            if (nk <= 0) continue;
            int skip = 0; /* leading keys of the block below every row's window, whole tiles */
            if (window > 0) {
                const int64_t glo = j->pos0 + (r0 < R ? r0 : R - 1) / G - window + 1;
                if (glo >= gend) continue;
                if (glo > kb) skip = (int)(glo - kb) / DS4N_KT * DS4N_KT;
            }
            const int ntile = (nk + DS4N_KT - 1) / DS4N_KT;
            for (int tt = skip / DS4N_KT; tt < ntile; tt++) {
                if (r0 == 0 && tt * DS4N_KT < next) {
                    const int64_t keys = next - tt * DS4N_KT < DS4N_KT ? next - tt * DS4N_KT
                                                                       : DS4N_KT;
                    ds4n_prefetch_l2(K + (nkb / DS4N_KT + tt) * ktile, ktile);
                    ds4n_prefetch_l2(V + (nkb + tt * DS4N_KT) * vrow, keys * vrow);
                }
                qk_tile(Q + (int64_t)r0 * hd, hd, K + (kb / DS4N_KT + tt) * ktile,
                        S + (int64_t)r0 * DS4N_KBLOCK + tt * DS4N_KT, rg, kvt);
            }
            for (int r = r0; r < r0 + rg; r++) {
                int64_t rend = r >= R ? 0 : ds4n_attn_keys_hi(j, j->pos0 + r / G);
                if (rend > gend) rend = gend;
                int64_t rlo = window > 0 && r < R ? j->pos0 + r / G - window + 1 : kb;
                if (rlo < kb + skip) rlo = kb + skip;
                softmax_step(S + (int64_t)r * DS4N_KBLOCK + skip, ntile * DS4N_KT - skip,
                             (int)(rlo - kb - skip), (int)(rend - kb - skip), m + r, l + r,
                             corr + r);
            }
            pv_tile(S + (int64_t)r0 * DS4N_KBLOCK + skip, nk - skip, V + (kb + skip) * vrow,
                    hd, O + (int64_t)r0 * hd, corr + r0, rg, kvt);
        }
    }
    for (int r = 0; r < R; r++) {
        float *out = j->o + (r / G) * j->o_stride + (int64_t)(r % G) * hd;
        const float *o = O + (int64_t)r * hd;
        if (j->m) {
            j->m[r] = m[r];
            j->l[r] = l[r];
            memcpy(out, o, sizeof(float) * hd);
        } else {
            scale_row(out, o,
                      ds4n_attn_norm_factor(m[r], l[r], j->sinks ? j->sinks + r % G : NULL), hd);
        }
    }
}

/* The tiles need whole 16-float head chunks and tile-aligned key ranges; anything else
 * (and an unknown KV type) takes the scalar kernel. rg and the type are constants in each
 * call so each inlines specialised. A lone row (decode without grouped-query heads: one
 * query head per kv head) is a group of 1, not 3: two padding rows tripled its products
 * (the 1.7B's decode attention 1.2x faster, docs/benchmarks-real-sizes.md). A set with the
 * registers for it (ATTN_RG4) takes groups of 4 rows when they fit the rows exactly and 6
 * would not (4 query heads per kv head, one or two tokens: groups of 6 would compute 2 of
 * every 6 rows as padding). Each row's arithmetic is the same whatever its group
 * (tests/reference/check_attention.c checks it bitwise). */
#ifndef ATTN_RG4
#define ATTN_RG4 0
#endif
#define DS4N_ATTEND_TYPE(j, scratch, t)                                          \
    do {                                                                         \
        const int rows_ = (j)->n_tok * (j)->n_group;                             \
        if (rows_ == 1)                                                          \
            attend(j, scratch, 1, t);                                            \
        else if (rows_ <= 3)                                                     \
            attend(j, scratch, 3, t);                                            \
        else if (ATTN_RG4 && rows_ % 4 == 0 && rows_ % 6 != 0 && rows_ <= 16)    \
            attend(j, scratch, 4, t);                                            \
        else                                                                     \
            attend(j, scratch, 6, t);                                            \
    } while (0)

#define DS4N_DEFINE_ATTN(name)                                      \
    void name(const ds4n_attn_job *j, float *scratch) {             \
        if (j->head_dim % 16 != 0 || j->k0 % DS4N_KT != 0 ||        \
            ds4n_kv_row_bytes(j->kv_type, j->head_dim) == 0) {      \
            ds4n_attn_scalar(j, scratch);                           \
            return;                                                 \
        }                                                           \
        if (j->kv_type == DS4N_KV_F16)                              \
            DS4N_ATTEND_TYPE(j, scratch, DS4N_KV_F16);              \
        else if (j->kv_type == DS4N_KV_Q8_0)                        \
            DS4N_ATTEND_TYPE(j, scratch, DS4N_KV_Q8_0);             \
        else                                                        \
            DS4N_ATTEND_TYPE(j, scratch, DS4N_KV_F32);              \
    }

#endif
