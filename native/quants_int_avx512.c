/* Integer-activation kernels on AVX-512 VNNI (compiled with the AVX-512 flags and -mavx512vnni,
 * used only when the CPU has it). The arithmetic is quants_int.h's, lane for lane: a zmm holds
 * a pair of blocks' codes as 64 unsigned bytes, VPDPBUSD sums each lane's 4 code × limb
 * products, and the float steps run on the same lanes in the same order as the reference, so
 * the results are bitwise the scalar kernels'. The codes of a group are unpacked once for all
 * T tokens of a call (batched decode and prefill tiles), the only difference from T = 1. */
#include <immintrin.h>

#include "prefetch.h"
#include "quants_int.h"
#include "quants_simd.h"

/* Codes of pair i (blocks 2i, 2i+1) of the group at grp, as 64 unsigned bytes in value order;
 * with one = 1 only block 2i exists (the last of a row of the 32-block types) and the high
 * half is zero. */
DS4N_INLINE __m512i pair_codes(int type, const uint8_t *grp, int i, int one) {
    const __m512i nib = _mm512_set1_epi8(0x0f);
    switch (type) {
    case DS4N_Q8_0: {
        const block_q8_0 *p = (const block_q8_0 *)grp + 2 * i;
        const __m256i a = _mm256_loadu_si256((const __m256i *)p[0].qs);
        const __m256i b = one ? _mm256_set1_epi8((char)0x80)
                              : _mm256_loadu_si256((const __m256i *)p[1].qs);
        const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
        return _mm512_xor_si512(z, _mm512_set1_epi8((char)0x80)); /* w + 128 */
    }
    default: { /* DS4N_Q4_0, DS4N_Q4_1 */
        const int64_t bb = type == DS4N_Q4_0 ? sizeof(block_q4_0) : sizeof(block_q4_1);
        const uint8_t *p = grp + 2 * i * bb + (type == DS4N_Q4_0 ? 2 : 4); /* the qs */
        const __m256i a = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
        const __m256i b = one ? _mm256_setzero_si256()
                              : _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(p + bb)));
        const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
        /* 128-bit lanes: low nibbles of each block, then its high nibbles */
        return _mm512_and_si512(_mm512_mask_blend_epi64(0xcc, z, _mm512_srli_epi16(z, 4)), nib);
    }
    }
}

/* ws and mb of a group of n blocks, as ds4n_int_scales computes them (the same products,
 * rounded once each), in vectors: 8 slots, zero past n. */
DS4N_INLINE void group_scales(int type, const uint8_t *grp, int n, __m256 *ws, __m256 *mb) {
    switch (type) {
    case DS4N_Q4_1: {
        /* d and m of each block in one 32-bit gather (blocks past n: zero) */
        const __m256i dm = _mm256_mmask_i32gather_epi32(
            _mm256_setzero_si256(), (__mmask8)((1u << n) - 1),
            _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(20)),
            grp, 1);
        *ws = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(dm));
        *mb = _mm256_xor_ps(_mm256_set1_ps(-0.0f), /* exactly -m */
                            _mm256_cvtph_ps(_mm256_cvtepi32_epi16(_mm256_srli_epi32(dm, 16))));
        break;
    }
    default: { /* DS4N_Q8_0, DS4N_Q4_0 */
        const int bb = type == DS4N_Q8_0 ? (int)sizeof(block_q8_0) : (int)sizeof(block_q4_0);
        /* d (and the next 2 bytes) of each block in one gather: loads, no store forwarding */
        const __m256i d = _mm256_mmask_i32gather_epi32(
            _mm256_setzero_si256(), (__mmask8)((1u << n) - 1),
            _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(bb)),
            grp, 1);
        const __m256 w = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(d));
        *ws = w;
        *mb = _mm256_mul_ps(w, _mm256_set1_ps(type == DS4N_Q8_0 ? 128.0f : 8.0f));
    }
    }
}

/* ds4n_int_finish's tree, halves added pairwise, in registers. */
DS4N_INLINE float finish(__m512 acc, __m256 accm) {
    const __m256 a8 = _mm256_add_ps(_mm512_castps512_ps256(acc), _mm512_extractf32x8_ps(acc, 1));
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(a8), _mm256_extractf128_ps(a8, 1));
    __m128 m = _mm_add_ps(_mm256_castps256_ps128(accm), _mm256_extractf128_ps(accm, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    m = _mm_add_ps(m, _mm_movehl_ps(m, m));
    a = _mm_add_ss(a, _mm_movehdup_ps(a));
    m = _mm_add_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(_mm_sub_ss(a, m));
}

DS4N_INLINE void int_row(int type, const uint8_t *w, const struct ds4n_xq *xq, int64_t t0, float *y,
                         int64_t ldy, const int T) {
    const int L = xq->limbs;
    const int64_t K = xq->K, nb = xq->nb, gb = ds4n_int_group_bytes(type);
    __m512 acc[DS4N_SMALL_T];
    __m256 accm[DS4N_SMALL_T];
    for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_ps(), accm[t] = _mm256_setzero_ps();
    /* The scale slot of each lane: block 2i + l/8 */
    const __m512i slot8 = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512 third = _mm512_set1_ps(0x1p-7f);
    for (int64_t gi = 0; gi * 8 < nb; gi++) {
        const uint8_t *grp = w + gi * gb;
        /* n < 8 only in the last group of a 32-block type: its pairs past n are skipped, a
         * lone last block takes the low 8 lanes, the block sums the first n */
        const int n = nb - gi * 8 < 8 ? (int)(nb - gi * 8) : 8, pairs = (n + 1) / 2;
        const __mmask16 last = n % 2 ? 0x00ff : 0xffff;
        const __mmask8 blocks = (__mmask8)((1u << n) - 1);
        const __mmask64 lastq = n % 2 ? 0xffffffffull : ~0ull;
        __m512i c[4];
        __m512i slot[4];
        for (int i = 0; i < pairs; i++) {
            c[i] = pair_codes(type, grp, i, 2 * i + 1 == n);
            slot[i] = _mm512_add_epi32(slot8, _mm512_set1_epi32(2 * i));
        }
        __m256 ws8, mb8;
        group_scales(type, grp, n, &ws8, &mb8);
        for (int t = 0; t < T; t++) {
            const int64_t tt = t0 + t;
            const int8_t *q = xq->q + tt * L * K + gi * DS4N_INT_GROUP;
            const __m256 xs8 = _mm256_maskz_loadu_ps(blocks, xq->xs + tt * nb + gi * 8);
            const __m512 S = _mm512_castps256_ps512(_mm256_mul_ps(ws8, xs8));
            const __m256 M = _mm256_mul_ps(mb8, xs8);
            for (int i = 0; i < pairs; i++) {
                const __mmask64 lq = i + 1 == pairs ? lastq : ~0ull;
                const __m512i a0 = _mm512_maskz_loadu_epi8(lq, q + 64 * i);
                const __m512i a1 = _mm512_maskz_loadu_epi8(lq, q + K + 64 * i);
                const __m512i l0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), c[i], a0);
                const __m512i h = _mm512_dpbusd_epi32(_mm512_slli_epi32(l0, 7), c[i], a1);
                __m512 f = _mm512_cvtepi32_ps(h);
                if (L == 3) {
                    const __m512i a2 = _mm512_maskz_loadu_epi8(lq, q + 2 * K + 64 * i);
                    const __m512i l2 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), c[i], a2);
                    f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(l2), third, f);
                }
                acc[t] = _mm512_mask3_fmadd_ps(f, _mm512_permutexvar_ps(slot[i], S), acc[t],
                                               i + 1 == pairs ? last : 0xffff);
            }
            accm[t] = _mm256_mask3_fmadd_ps(
                M, _mm256_maskz_loadu_ps(blocks, xq->bsum + tt * nb + gi * 8), accm[t], blocks);
        }
    }
    for (int t = 0; t < T; t++) y[t * ldy] = finish(acc[t], accm[t]);
}

/* ---- the super-block format (Q4_K, Q6_K; quants_int.h) ---------------------------------- */

/* A Q4_K or Q6_K super-block as 8 vectors of 32 int16 code·scale (vector i: values 32i ..
 * 32i + 31), its d (and Q4_K's dmin), and Q4_K's mins in the low 8 int32 lanes of m. */
DS4N_INLINE void sb_weights(int type, const uint8_t *blk, __m512i w[8], float *d, float *dmin,
                            __m512i *m) {
    if (type == DS4N_Q4_K) {
        const block_q4_K *p = (const block_q4_K *)blk;
        uint64_t sc, mn;
        ds4n_k_scale_min8(p->scales, &sc, &mn);
        *d = _cvtsh_ss(p->d);
        *dmin = _cvtsh_ss(p->dmin);
        *m = _mm512_cvtepu8_epi32(_mm_cvtsi64_si128((long long)mn));
        const __m512i nib = _mm512_set1_epi16(0x0f);
        for (int q = 0; q < 4; q++) {
            const __m512i z = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(p->qs + 32 * q)));
            w[2 * q] = _mm512_mullo_epi16(_mm512_and_si512(z, nib),
                                          _mm512_set1_epi16((short)(sc >> (16 * q) & 0xff)));
            w[2 * q + 1] = _mm512_mullo_epi16(_mm512_srli_epi16(z, 4),
                                              _mm512_set1_epi16((short)(sc >> (16 * q + 8) & 0xff)));
        }
        return;
    }
    const block_q6_K *p = (const block_q6_K *)blk; /* DS4N_Q6_K */
    *d = _cvtsh_ss(p->d);
    *dmin = 0.0f;
    *m = _mm512_setzero_si512();
    /* the 16 scales as int16 in the low half; vector i takes 16-groups 2i and 2i + 1 */
    const __m512i sc = _mm512_cvtepi8_epi16(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)p->scales)));
    const __m512i half = _mm512_set_epi16(1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                          0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m256i nib = _mm256_set1_epi8(0x0f), hi2 = _mm256_set1_epi8(0x30);
    const __m512i bias = _mm512_set1_epi16(32);
    for (int h = 0; h < 2; h++) {
        const __m256i l0 = _mm256_loadu_si256((const __m256i *)(p->ql + 64 * h));
        const __m256i l1 = _mm256_loadu_si256((const __m256i *)(p->ql + 64 * h + 32));
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(p->qh + 32 * h));
        const __m256i q[4] = {
            _mm256_or_si256(_mm256_and_si256(l0, nib), _mm256_and_si256(_mm256_slli_epi16(qh, 4), hi2)),
            _mm256_or_si256(_mm256_and_si256(l1, nib), _mm256_and_si256(_mm256_slli_epi16(qh, 2), hi2)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), nib), _mm256_and_si256(qh, hi2)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), nib),
                            _mm256_and_si256(_mm256_srli_epi16(qh, 2), hi2)),
        };
        for (int r = 0; r < 4; r++) {
            const int i = 4 * h + r;
            const __m512i s = _mm512_permutexvar_epi16(_mm512_add_epi16(half, _mm512_set1_epi16((short)(2 * i))), sc);
            w[i] = _mm512_mullo_epi16(_mm512_sub_epi16(_mm512_cvtepu8_epi16(q[r]), bias), s);
        }
    }
}

/* Σ over a group of w·a, lane for lane (int32, exact: quants_int.h bounds it), in `chains`
 * independent sums (1 when several tokens already hide the dot products' latency). */
DS4N_INLINE __m512i sb_dot(const __m512i w[8], const int16_t *a, const int chains) {
    __m512i s[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(),
                    _mm512_setzero_si512()};
    for (int i = 0; i < 8; i++)
        s[i % chains] = _mm512_dpwssd_epi32(s[i % chains], w[i], _mm512_loadu_si512(a + 32 * i));
    if (chains == 4) s[0] = _mm512_add_epi32(s[0], s[2]), s[1] = _mm512_add_epi32(s[1], s[3]);
    return chains > 1 ? _mm512_add_epi32(s[0], s[1]) : s[0];
}

DS4N_INLINE float finish16(__m512 acc) {
    const __m256 a8 = _mm256_add_ps(_mm512_castps512_ps256(acc), _mm512_extractf32x8_ps(acc, 1));
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(a8), _mm256_extractf128_ps(a8, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_movehdup_ps(a));
    return _mm_cvtss_f32(a);
}

/* Groups [g0, g1) of row w against tokens t0 .. t0 + T - 1, into acc[T]. */
DS4N_INLINE void sb_groups(int type, const uint8_t *w, const struct ds4n_xq *xq, int64_t g0,
                           int64_t g1, int64_t t0, __m512 *acc, const int T) {
    const int nl = xq->limbs - 1;
    const int64_t nb = xq->nb, ng = nb / 8;
    const int64_t bb = type == DS4N_Q4_K ? (int64_t)sizeof(block_q4_K) : (int64_t)sizeof(block_q6_K);
    const int chains = T == 1 ? 4 : T < 4 ? 2 : 1;
    const __m512 third = _mm512_set1_ps(0x1p-7f);
    for (int64_t g = g0; g < g1; g++) {
        __m512i W[8], m;
        float d, dmin;
        sb_weights(type, w + g * bb, W, &d, &dmin, &m);
        for (int t = 0; t < T; t++) {
            const int64_t tt = t0 + t;
            const float xs = xq->xs[tt * ng + g];
            const int16_t *a = xq->a + tt * nl * xq->lda + g * DS4N_INT_GROUP;
            __m512 f = _mm512_cvtepi32_ps(sb_dot(W, a, chains));
            if (nl == 2) f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sb_dot(W, a + xq->lda, chains)), third, f);
            acc[t] = _mm512_fmadd_ps(f, _mm512_set1_ps(d * xs), acc[t]);
            if (type == DS4N_Q4_K) {
                const int32_t *as = xq->asum + tt * nl * nb + 8 * g;
                __m512 mm = _mm512_cvtepi32_ps(_mm512_mullo_epi32(m, _mm512_maskz_loadu_epi32(0xff, as)));
                if (nl == 2)
                    mm = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_mullo_epi32(
                                             m, _mm512_maskz_loadu_epi32(0xff, as + nb))),
                                         third, mm);
                acc[t] = _mm512_mask3_fnmadd_ps(mm, _mm512_set1_ps(dmin * xs), acc[t], 0x00ff);
            }
        }
    }
}

DS4N_INLINE void sb_row(int type, const uint8_t *w, const struct ds4n_xq *xq, int64_t t0,
                        float *y, int64_t ldy, const int T) {
    __m512 acc[DS4N_SMALL_T];
    for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_ps();
    sb_groups(type, w, xq, 0, xq->nb / 8, t0, acc, T);
    for (int t = 0; t < T; t++) y[t * ldy] = finish16(acc[t]);
}

/* The prefill tile's step (ds4n_sb_part_fn): the accumulators carried in memory. */
DS4N_INLINE void sb_part(int type, const uint8_t *w, const struct ds4n_xq *xq, int64_t g0,
                         int64_t g1, int64_t t0, float *accmem, float *y, int64_t ldy,
                         const int T) {
    __m512 acc[DS4N_SMALL_T];
    for (int t = 0; t < T; t++)
        acc[t] = g0 == 0 ? _mm512_setzero_ps() : _mm512_load_ps(accmem + 16 * t);
    sb_groups(type, w, xq, g0, g1, t0, acc, T);
    if (y)
        for (int t = 0; t < T; t++) y[t * ldy] = finish16(acc[t]);
    else
        for (int t = 0; t < T; t++) _mm512_store_ps(accmem + 16 * t, acc[t]);
}

DS4N_INT_ROW_KERNEL(q4_K, DS4N_Q4_K, sb_row)
DS4N_INT_ROW_KERNEL(q6_K, DS4N_Q6_K, sb_row)
DS4N_INT_PART_KERNEL(q4_K, DS4N_Q4_K, sb_part)
DS4N_INT_PART_KERNEL(q6_K, DS4N_Q6_K, sb_part)

/* Decode (ds4n_int_rows_fn): R rows from R streams, super-block by super-block, so the R
 * streams are read in step (a single long row is one stream, which the prefetchers do not
 * keep at the memory's rate); each row's steps are sb_groups' for T = 1, in its order, so
 * y[r] is bitwise the one-row kernel's (its integer sums are exact in any order: two chains
 * of dot products per row here, the R rows' chains overlapping, measured 3-4 % faster than
 * the one-row kernel's four, L2-resident). The group's activations are loaded R times, from
 * L1. R and the activation limbs nl (1: int2, 2: int3) are constants in each copy, and the
 * row loop is unrolled: GCC otherwise kept the R accumulators in memory, reloaded the block
 * sums for every row and tested nl in every super-block (decode 1.11-1.32x without that,
 * docs/benchmarks-real-sizes.md). */
DS4N_INLINE void sb_rows1(int type, const uint8_t *w, int64_t stride, const struct ds4n_xq *xq,
                          float *y, const int R, const int nl) {
    const int64_t nb = xq->nb, ng = nb / 8;
    const int64_t bb = type == DS4N_Q4_K ? (int64_t)sizeof(block_q4_K) : (int64_t)sizeof(block_q6_K);
    const __m512 third = _mm512_set1_ps(0x1p-7f);
    __m512 acc[DS4N_MV_ROWS];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t g = 0; g < ng; g++) {
        const float xs = xq->xs[g];
        const int16_t *a = xq->a + g * DS4N_INT_GROUP;
        /* the group's block sums (Q4_K's mins), loaded once for the R rows */
        const __m512i as0 = _mm512_maskz_loadu_epi32(0xff, xq->asum + 8 * g);
        const __m512i as1 = nl == 2 ? _mm512_maskz_loadu_epi32(0xff, xq->asum + nb + 8 * g) : as0;
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m512i W[8], m;
            float d, dmin;
            ds4n_prefetch_ahead(w + r * stride + g * bb, bb);
            sb_weights(type, w + r * stride + g * bb, W, &d, &dmin, &m);
            __m512 f = _mm512_cvtepi32_ps(sb_dot(W, a, 2));
            if (nl == 2) f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sb_dot(W, a + xq->lda, 2)), third, f);
            acc[r] = _mm512_fmadd_ps(f, _mm512_set1_ps(d * xs), acc[r]);
            if (type == DS4N_Q4_K) {
                __m512 mm = _mm512_cvtepi32_ps(_mm512_mullo_epi32(m, as0));
                if (nl == 2)
                    mm = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_mullo_epi32(m, as1)), third, mm);
                acc[r] = _mm512_mask3_fnmadd_ps(mm, _mm512_set1_ps(dmin * xs), acc[r], 0x00ff);
            }
        }
    }
    for (int r = 0; r < R; r++) y[r] = finish16(acc[r]);
}

/* sb_rows1 with R a constant as well as nl: one copy per (rows, limbs). */
DS4N_INLINE void sb_rows(int type, const uint8_t *w, int64_t stride, const struct ds4n_xq *xq,
                         float *y, int R, const int nl) {
    switch (R) {
    case 1: sb_rows1(type, w, stride, xq, y, 1, nl); break;
    case 2: sb_rows1(type, w, stride, xq, y, 2, nl); break;
    case 3: sb_rows1(type, w, stride, xq, y, 3, nl); break;
    default: sb_rows1(type, w, stride, xq, y, 4, nl); break;
    }
}

#define SB_ROWS_KERNEL(name, type)                                                             \
    static void rows_##name(const void *w, int64_t stride, const struct ds4n_xq *xq, float *y, \
                            int R) {                                                           \
        if (xq->limbs == 2)                                                                    \
            sb_rows(type, w, stride, xq, y, R, 1); /* int2: one int16 limb */                  \
        else                                                                                   \
            sb_rows(type, w, stride, xq, y, R, 2); /* int3 */                                  \
    }
_Static_assert(DS4N_MV_ROWS == 4, "SB_ROWS_KERNEL covers 1..4 rows");
SB_ROWS_KERNEL(q4_K, DS4N_Q4_K)
SB_ROWS_KERNEL(q6_K, DS4N_Q6_K)

/* ---- the prefill tile (ds4n_sb_tile_fn) -------------------------------------------------- */

static void sb_unpack(int type, const uint8_t *row, struct ds4n_sb_panel *p, int64_t i) {
    const int64_t bb = type == DS4N_Q4_K ? (int64_t)sizeof(block_q4_K) : (int64_t)sizeof(block_q6_K);
    for (int64_t g = 0; g < p->ng; g++) {
        const int64_t at = i * p->ng + g;
        __m512i W[8], m;
        sb_weights(type, row + g * bb, W, &p->d[at], &p->dmin[at], &m);
        for (int v = 0; v < 8; v++) _mm512_store_si512(p->w + at * DS4N_INT_GROUP + 32 * v, W[v]);
        _mm256_store_si256((__m256i *)(p->m + 8 * at), _mm512_castsi512_si256(m));
    }
}

/* R rows x C tokens (constants) over groups [g0, g1): the R·C lane sums of a super-block are
 * built in registers (each weight vector loaded once for the C tokens, each activation vector
 * once for the R rows), then each (row, token) takes ds4n_sb_group_ref's float steps in its
 * order. NL: activation limbs (1: int2, 2: int3). */
DS4N_INLINE void sb_tile_rc(int type, const struct ds4n_sb_panel *p, int64_t i0,
                            const struct ds4n_xq *xq, int64_t t0, int64_t g0, int64_t g1,
                            float *accmem, float *y, int64_t ldy, const int R, const int C,
                            const int NL) {
    const int64_t ng = p->ng, nb = xq->nb, lda = xq->lda;
    const __m512 third = _mm512_set1_ps(0x1p-7f);
    __m512 acc[DS4N_SB_TILE_R][DS4N_SB_TILE_C];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < C; t++)
            acc[r][t] = g0 == 0 ? _mm512_setzero_ps()
                                : _mm512_load_ps(accmem + (r * DS4N_SB_TILE_C + t) * 16);
    for (int64_t g = g0; g < g1; g++) {
        __m512i s[DS4N_SB_TILE_R][DS4N_SB_TILE_C], s1[DS4N_SB_TILE_R][DS4N_SB_TILE_C];
        for (int r = 0; r < R; r++)
            for (int t = 0; t < C; t++) s[r][t] = s1[r][t] = _mm512_setzero_si512();
        const int16_t *w = p->w + ((i0)*ng + g) * DS4N_INT_GROUP;
        const int16_t *a = xq->a + t0 * NL * lda + g * DS4N_INT_GROUP;
        for (int v = 0; v < 8; v++) {
            __m512i W[DS4N_SB_TILE_R];
            for (int r = 0; r < R; r++) W[r] = _mm512_load_si512(w + r * ng * DS4N_INT_GROUP + 32 * v);
            for (int t = 0; t < C; t++) {
                /* In a register: a compiler would otherwise fold the load into each of the
                 * R dot products, R loads where one does (the loads are what bind here). */
                __m512i A = _mm512_loadu_si512(a + t * NL * lda + 32 * v);
                if (R > 1) __asm__("" : "+v"(A));
                for (int r = 0; r < R; r++) s[r][t] = _mm512_dpwssd_epi32(s[r][t], W[r], A);
                if (NL == 2) {
                    __m512i A1 = _mm512_loadu_si512(a + (t * NL + 1) * lda + 32 * v);
                    if (R > 1) __asm__("" : "+v"(A1));
                    for (int r = 0; r < R; r++) s1[r][t] = _mm512_dpwssd_epi32(s1[r][t], W[r], A1);
                }
            }
        }
        /* d·xs (and dmin·xs) of every (row, token), each rounded once as the reference's,
         * in a vector product; the FMAs take them as broadcast memory operands. */
        _Alignas(64) float D[DS4N_SB_TILE_R * DS4N_SB_TILE_C], Dm[DS4N_SB_TILE_R * DS4N_SB_TILE_C];
        {
            __m128 xs4 = _mm_setzero_ps();
            for (int t = 0; t < C; t++) xs4[t] = xq->xs[(t0 + t) * ng + g];
            for (int r = 0; r < R; r++) {
                const int64_t at = (i0 + r) * ng + g;
                _mm_store_ps(D + r * 4, _mm_mul_ps(_mm_set1_ps(p->d[at]), xs4));
                if (type == DS4N_Q4_K) _mm_store_ps(Dm + r * 4, _mm_mul_ps(_mm_set1_ps(p->dmin[at]), xs4));
            }
        }
        for (int r = 0; r < R; r++) {
            const int64_t at = (i0 + r) * ng + g;
            __m256i m = _mm256_setzero_si256();
            if (type == DS4N_Q4_K) m = _mm256_load_si256((const __m256i *)(p->m + 8 * at));
            for (int t = 0; t < C; t++) {
                const int64_t tt = t0 + t;
                __m512 f = _mm512_cvtepi32_ps(s[r][t]);
                if (NL == 2) f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1[r][t]), third, f);
                acc[r][t] = _mm512_fmadd_ps(f, _mm512_set1_ps(D[r * 4 + t]), acc[r][t]);
                if (type == DS4N_Q4_K) {
                    const int32_t *as = xq->asum + tt * NL * nb + 8 * g;
                    __m256 mm = _mm256_cvtepi32_ps(_mm256_mullo_epi32(m, _mm256_loadu_si256((const __m256i *)as)));
                    if (NL == 2)
                        mm = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_mullo_epi32(
                                                 m, _mm256_loadu_si256((const __m256i *)(as + nb)))),
                                             _mm512_castps512_ps256(third), mm);
                    acc[r][t] = _mm512_mask3_fnmadd_ps(_mm512_castps256_ps512(mm),
                                                       _mm512_set1_ps(Dm[r * 4 + t]), acc[r][t], 0x00ff);
                }
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < C; t++) {
            if (y) y[t * ldy + r] = finish16(acc[r][t]);
            else _mm512_store_ps(accmem + (r * DS4N_SB_TILE_C + t) * 16, acc[r][t]);
        }
}

#define SB_TILE_CASE(R_, C_, type, NL_)                                                        \
    case (R_) * 8 + (C_):                                                                      \
        sb_tile_rc(type, p, i0, xq, t0, g0, g1, acc, y, ldy, R_, C_, NL_);                     \
        break;
#define SB_TILE_ROWS(R_, type, NL_)                                                            \
    SB_TILE_CASE(R_, 1, type, NL_) SB_TILE_CASE(R_, 2, type, NL_)                              \
    SB_TILE_CASE(R_, 3, type, NL_) SB_TILE_CASE(R_, 4, type, NL_)
#if DS4N_SB_TILE_R == 2
#define SB_TILE_MORE(type, NL_)
#elif DS4N_SB_TILE_R == 3
#define SB_TILE_MORE(type, NL_) SB_TILE_ROWS(3, type, NL_)
#else
#define SB_TILE_MORE(type, NL_) SB_TILE_ROWS(3, type, NL_) SB_TILE_ROWS(4, type, NL_)
#endif
#define SB_TILE_SWITCH(type, NL_)                                                              \
    switch (R * 8 + C) {                                                                       \
        SB_TILE_ROWS(1, type, NL_)                                                             \
        SB_TILE_ROWS(2, type, NL_)                                                             \
        SB_TILE_MORE(type, NL_)                                                                \
    default: break;                                                                            \
    }
_Static_assert(DS4N_SB_TILE_R >= 2 && DS4N_SB_TILE_R <= 4 && DS4N_SB_TILE_C <= 4,
               "SB_TILE_SWITCH covers up to 4 x 4");

static void sb_tile(int type, const struct ds4n_sb_panel *p, int64_t i0, int R,
                    const struct ds4n_xq *xq, int64_t t0, int C, int64_t g0, int64_t g1,
                    float *acc, float *y, int64_t ldy) {
    if (type == DS4N_Q4_K) {
        if (xq->limbs == 3) SB_TILE_SWITCH(DS4N_Q4_K, 2) else SB_TILE_SWITCH(DS4N_Q4_K, 1)
    } else {
        if (xq->limbs == 3) SB_TILE_SWITCH(DS4N_Q6_K, 2) else SB_TILE_SWITCH(DS4N_Q6_K, 1)
    }
}

/* Decode (ds4n_int_rows_fn) of the block-format types: R rows from R streams, group by group,
 * so the R streams are read in step (sb_rows1's reason); each row's steps are int_row's for
 * T = 1, in its order, so y[r] is bitwise the one-row kernel's. */
DS4N_INLINE void int_rows1(int type, const uint8_t *w, int64_t stride, const struct ds4n_xq *xq,
                           float *y, const int R) {
    const int L = xq->limbs;
    const int64_t K = xq->K, nb = xq->nb, gb = ds4n_int_group_bytes(type);
    __m512 acc[DS4N_MV_ROWS];
    __m256 accm[DS4N_MV_ROWS];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps(), accm[r] = _mm256_setzero_ps();
    const __m512i slot8 = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512 third = _mm512_set1_ps(0x1p-7f);
    for (int64_t gi = 0; gi * 8 < nb; gi++) {
        const int n = nb - gi * 8 < 8 ? (int)(nb - gi * 8) : 8, pairs = (n + 1) / 2;
        const __mmask16 last = n % 2 ? 0x00ff : 0xffff;
        const __mmask8 blocks = (__mmask8)((1u << n) - 1);
        const __mmask64 lastq = n % 2 ? 0xffffffffull : ~0ull;
        const int8_t *q = xq->q + gi * DS4N_INT_GROUP;
        const __m256 xs8 = _mm256_maskz_loadu_ps(blocks, xq->xs + gi * 8);
        const __m256 bsum8 = _mm256_maskz_loadu_ps(blocks, xq->bsum + gi * 8);
        for (int r = 0; r < R; r++) {
            const uint8_t *grp = w + r * stride + gi * gb;
            ds4n_prefetch_ahead(grp, gb);
            __m256 ws8, mb8;
            group_scales(type, grp, n, &ws8, &mb8);
            const __m512 S = _mm512_castps256_ps512(_mm256_mul_ps(ws8, xs8));
            const __m256 M = _mm256_mul_ps(mb8, xs8);
            for (int i = 0; i < pairs; i++) {
                const __m512i c = pair_codes(type, grp, i, 2 * i + 1 == n);
                const __m512i slot = _mm512_add_epi32(slot8, _mm512_set1_epi32(2 * i));
                const __mmask64 lq = i + 1 == pairs ? lastq : ~0ull;
                const __m512i a0 = _mm512_maskz_loadu_epi8(lq, q + 64 * i);
                const __m512i a1 = _mm512_maskz_loadu_epi8(lq, q + K + 64 * i);
                const __m512i l0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), c, a0);
                const __m512i h = _mm512_dpbusd_epi32(_mm512_slli_epi32(l0, 7), c, a1);
                __m512 f = _mm512_cvtepi32_ps(h);
                if (L == 3) {
                    const __m512i a2 = _mm512_maskz_loadu_epi8(lq, q + 2 * K + 64 * i);
                    const __m512i l2 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), c, a2);
                    f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(l2), third, f);
                }
                acc[r] = _mm512_mask3_fmadd_ps(f, _mm512_permutexvar_ps(slot, S), acc[r],
                                               i + 1 == pairs ? last : 0xffff);
            }
            accm[r] = _mm256_mask3_fmadd_ps(M, bsum8, accm[r], blocks);
        }
    }
    for (int r = 0; r < R; r++) y[r] = finish(acc[r], accm[r]);
}

DS4N_INT_ROWS_KERNEL(q8_0, DS4N_Q8_0, int_rows1)
DS4N_INT_ROWS_KERNEL(q4_0, DS4N_Q4_0, int_rows1)
DS4N_INT_ROWS_KERNEL(q4_1, DS4N_Q4_1, int_rows1)
DS4N_INT_ROW_KERNEL(q8_0, DS4N_Q8_0, int_row)
DS4N_INT_ROW_KERNEL(q4_0, DS4N_Q4_0, int_row)
DS4N_INT_ROW_KERNEL(q4_1, DS4N_Q4_1, int_row)

/* ds4n_sb_quantize_group in vectors: the same exact steps (roundscale is rint, ties to even). */
static void sb_quantize_group(const float *x, int L, int16_t *a, int64_t K, float *xs,
                              int32_t *asum, int64_t nb) {
    const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    __m512 mx = _mm512_setzero_ps();
    __mmask16 bad = 0;
    for (int j = 0; j < DS4N_INT_GROUP; j += 16) {
        const __m512 v = _mm512_and_ps(_mm512_loadu_ps(x + j), absmask);
        bad |= _mm512_cmp_ps_mask(v, _mm512_set1_ps(FLT_MAX), _CMP_NLE_UQ); /* inf, NaN */
        mx = _mm512_max_ps(mx, v);
    }
    const float amax = _mm512_reduce_max_ps(mx);
    if (bad || amax < DS4N_INT_TINY) {
        ds4n_sb_zero_group(L, a, K, xs, asum, nb, !bad);
        return;
    }
    uint32_t bits;
    memcpy(&bits, &amax, 4);
    const int E = (int)(bits >> 23) - 127;
    const __m512 inv = _mm512_set1_ps(ds4n_pow2f(14 - E));
    const __m512 top = _mm512_set1_ps(DS4N_SB_AMAX);
#define RN (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
    for (int b = 0; b < 8; b++) {
        __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
        for (int h = 0; h < 2; h++) {
            const int j = 32 * b + 16 * h;
            const __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x + j), inv);
            const __m512 l = _mm512_min_ps(_mm512_max_ps(_mm512_roundscale_ps(v, RN),
                                                          _mm512_sub_ps(_mm512_setzero_ps(), top)),
                                           top);
            const __m512i li = _mm512_cvtps_epi32(l);
            _mm256_storeu_si256((__m256i *)(a + j), _mm512_cvtepi32_epi16(li));
            s0 = _mm512_add_epi32(s0, li);
            if (L == 3) {
                const __m512i l1 = _mm512_cvtps_epi32(_mm512_roundscale_ps(
                    _mm512_mul_ps(_mm512_sub_ps(v, l), _mm512_set1_ps(128.0f)), RN));
                _mm256_storeu_si256((__m256i *)(a + K + j), _mm512_cvtepi32_epi16(l1));
                s1 = _mm512_add_epi32(s1, l1);
            }
        }
        asum[b] = _mm512_reduce_add_epi32(s0);
        if (L == 3) asum[nb + b] = _mm512_reduce_add_epi32(s1);
    }
    *xs = ds4n_pow2f(E - 14);
#undef RN
}

static DS4N_INT_DEFINE_QUANTIZE(xq_quantize, ds4n_int_quantize_block, sb_quantize_group,
                                ds4n_sb_split_group)

DS4N_INT_DEFINE_SET(ds4n_int_avx512, sb_tile, sb_unpack);
