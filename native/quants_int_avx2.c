/* Integer-activation kernels on AVX2 (compiled with -mavx2 -mfma -mf16c): the level's own
 * kernels, and the fallback of AVX-512 CPUs without VNNI. The arithmetic is quants_int.h's,
 * lane for lane, so every result is bitwise the scalar kernels'; a ymm holds 8 of the 16
 * float lanes, so each lane vector of the definition is a pair of ymm here: lo (lanes 0..7)
 * and hi (lanes 8..15).
 *
 * The block format (Q8_0, Q4_0, Q4_1): lane l of pair i is block 2i + l/8, values 4·(l%8) ..
 * +3, so one block's 32 codes in a ymm give its 8 lanes in order: VPMADDUBSW (unsigned code ×
 * signed limb, adjacent pairs summed into int16) then VPMADDWD (adjacent int16 pairs into
 * int32). VPMADDUBSW saturates its int16 pair sums; the ranges keep it exact:
 *  - Q4_0, Q4_1: codes 0..15, limbs |l0| <= 127 and |l1|, |l2| <= 64 (quants_int.h: a residual
 *    of at most 1/2, times 2^7), so |c0·q0 + c1·q1| <= 2·15·127 = 3810;
 *  - Q8_0: its biased code w + 128 reaches 255: against l1 and l2 (|q| <= 64) a pair is at
 *    most 2·255·64 = 32640 < 2^15, but 2·255·127 would saturate, so limb 0's sum is split,
 *    Σ (w + 128)·l0 = Σ w·l0 + 128·Σ l0, with Σ w·l0 as VPMADDUBSW(|w|, l0·sign(w)) (|w| <=
 *    128: a pair is at most 2·128·127 = 32512) and Σ l0 as VPMADDUBSW(1, l0).
 * Every sum is an exact integer, so the order of the integer additions is free; the float
 * steps (conversion, the limb FMA, acc = fma(f, ws·xs, acc), the bias FMA, the tree) run in
 * the reference's order.
 *
 * The super-block format (Q4_K, Q6_K): VPMADDWD (int16 × int16, adjacent pairs into int32)
 * is VPDPWSSD without the accumulate; the lo lanes take values 32i .. 32i + 15 of each vector
 * i, the hi lanes 32i + 16 .. 32i + 31. */
#include <immintrin.h>

#include "quants_int.h"
#include "quants_simd.h"

/* ---- the block format (Q8_0, Q4_0, Q4_1) ------------------------------------------------- */

/* Codes of block b of the group at grp, 32 bytes in value order: Q8_0's signed w, the nibbles
 * of Q4_0 and Q4_1. */
DS4N_INLINE __m256i block_codes(int type, const uint8_t *grp, int b) {
    if (type == DS4N_Q8_0)
        return _mm256_loadu_si256((const __m256i *)((const block_q8_0 *)grp + b)->qs);
    const int64_t bb = type == DS4N_Q4_0 ? sizeof(block_q4_0) : sizeof(block_q4_1);
    const __m128i v = _mm_loadu_si128((const __m128i *)(grp + b * bb + (type == DS4N_Q4_0 ? 2 : 4)));
    /* low nibbles: values 0..15, high nibbles: values 16..31 */
    const __m256i z = _mm256_inserti128_si256(_mm256_castsi128_si256(v), _mm_srli_epi16(v, 4), 1);
    return _mm256_and_si256(z, _mm256_set1_epi8(0x0f));
}

/* h = 2^7·Σ c·l0 + Σ c·l1 over each lane's 4 values (int32 lanes 0..7 of the block), and with
 * three limbs Σ c·l2 (*s2). c: the codes (Q8_0: w + 128), w and wabs: Q8_0's signed codes and
 * their magnitudes, for limb 0 (above). */
DS4N_INLINE __m256i block_lanes(int type, __m256i c, __m256i w, __m256i wabs, const int8_t *q,
                                int64_t K, int L, __m256i *s2) {
    const __m256i ones16 = _mm256_set1_epi16(1), k128 = _mm256_set1_epi16(128);
    const __m256i q0 = _mm256_loadu_si256((const __m256i *)q);
    const __m256i q1 = _mm256_loadu_si256((const __m256i *)(q + K));
    __m256i h0; /* 2^7·Σ c·l0 */
    if (type == DS4N_Q8_0)
        h0 = _mm256_add_epi32(
            _mm256_madd_epi16(_mm256_maddubs_epi16(wabs, _mm256_sign_epi8(q0, w)), k128),
            _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), q0), _mm256_set1_epi16(1 << 14)));
    else
        h0 = _mm256_madd_epi16(_mm256_maddubs_epi16(c, q0), k128);
    if (L == 3)
        *s2 = _mm256_madd_epi16(_mm256_maddubs_epi16(c, _mm256_loadu_si256((const __m256i *)(q + 2 * K))), ones16);
    return _mm256_add_epi32(h0, _mm256_madd_epi16(_mm256_maddubs_epi16(c, q1), ones16));
}

/* ws and mb of a group of n blocks, as ds4n_int_scales computes them (the same products,
 * rounded once each): 8 slots, zero past n. */
DS4N_INLINE void group_scales(int type, const uint8_t *grp, int n, __m256 *ws, __m256 *mb) {
    const int bb = type == DS4N_Q8_0   ? (int)sizeof(block_q8_0)
                   : type == DS4N_Q4_0 ? (int)sizeof(block_q4_0)
                                       : (int)sizeof(block_q4_1);
    /* the first 4 bytes of each block (d, and Q4_1's m) in one gather: loads only, no store
     * forwarding; blocks past n are not read */
    const __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(bb));
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256i dm = _mm256_mask_i32gather_epi32(_mm256_setzero_si256(), (const int *)grp, idx, mask, 1);
    /* the low 16 bits of each 32 (d), then the high 16 (m), gathered into the low 128 bits */
    const __m256i lo16 = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1,
                                          0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m256i d = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(dm, lo16), 0x08);
    *ws = _mm256_cvtph_ps(_mm256_castsi256_si128(d));
    if (type == DS4N_Q4_1) {
        const __m256i m = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(_mm256_srli_epi32(dm, 16), lo16), 0x08);
        *mb = _mm256_xor_ps(_mm256_set1_ps(-0.0f), _mm256_cvtph_ps(_mm256_castsi256_si128(m))); /* -m */
    } else {
        *mb = _mm256_mul_ps(*ws, _mm256_set1_ps(type == DS4N_Q8_0 ? 128.0f : 8.0f));
    }
}

/* ds4n_int_finish's tree: lanes i and i + 8 (lo + hi), then halves pairwise. */
DS4N_INLINE float hsum16(__m256 lo, __m256 hi) {
    const __m256 a8 = _mm256_add_ps(lo, hi);
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(a8), _mm256_extractf128_ps(a8, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_movehdup_ps(a));
    return _mm_cvtss_f32(a);
}

DS4N_INLINE float finish(__m256 lo, __m256 hi, __m256 accm) {
    const __m256 a8 = _mm256_add_ps(lo, hi);
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(a8), _mm256_extractf128_ps(a8, 1));
    __m128 m = _mm_add_ps(_mm256_castps256_ps128(accm), _mm256_extractf128_ps(accm, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    m = _mm_add_ps(m, _mm_movehl_ps(m, m));
    a = _mm_add_ss(a, _mm_movehdup_ps(a));
    m = _mm_add_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(_mm_sub_ss(a, m));
}

/* The codes of block b: c (Q8_0: biased), and Q8_0's w and |w|. */
DS4N_INLINE void codes_of(int type, const uint8_t *grp, int b, __m256i *c, __m256i *w, __m256i *wabs) {
    *c = *w = *wabs = block_codes(type, grp, b);
    if (type == DS4N_Q8_0) {
        *wabs = _mm256_abs_epi8(*w);
        *c = _mm256_xor_si256(*w, _mm256_set1_epi8((char)0x80)); /* w + 128 */
    }
}

/* One group (n blocks at grp; with cc, their codes unpacked by codes_of: c, w, |w| per block)
 * against one token's limbs q (stride K) and its scales S = ws·xs and M = mb·xs, into acc
 * (lo, hi) and accm. */
DS4N_INLINE void group_token(int type, const int n, const uint8_t *grp, const __m256i (*cc)[3],
                             const int8_t *q, int64_t K, int L, __m256 S, __m256 M, __m256 bsum,
                             __m256 *lo, __m256 *hi, __m256 *accm) {
    const __m256 third = _mm256_set1_ps(0x1p-7f);
    for (int b = 0; b < n; b++) {
        __m256i c, w, wabs, s2 = _mm256_setzero_si256();
        if (cc) c = cc[b][0], w = cc[b][1], wabs = cc[b][2];
        else codes_of(type, grp, b, &c, &w, &wabs);
        const __m256i h = block_lanes(type, c, w, wabs, q + 32 * b, K, L, &s2);
        __m256 f = _mm256_cvtepi32_ps(h);
        if (L == 3) f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s2), third, f);
        const __m256 ws = _mm256_permutevar8x32_ps(S, _mm256_set1_epi32(b));
        if (b % 2) *hi = _mm256_fmadd_ps(f, ws, *hi);
        else *lo = _mm256_fmadd_ps(f, ws, *lo);
    }
    /* the bias of blocks past n: M and bsum are zero there, fma(0, 0, +0) keeps +0 */
    *accm = _mm256_fmadd_ps(M, bsum, *accm);
}

/* xs and bsum of a group's n blocks (zero past n: not read). */
DS4N_INLINE __m256 load_n(const float *p, int n) {
    if (n == 8) return _mm256_loadu_ps(p);
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    return _mm256_maskload_ps(p, mask);
}

/* Group gi (n blocks at grp) of one row against tokens t0 .. t0 + T - 1. One token unpacks
 * each block's codes where it uses them; more unpack them once for all. Called with a
 * constant n for the full groups, so the blocks' loop unrolls. */
DS4N_INLINE void int_group(int type, const uint8_t *grp, const int n, const struct ds4n_xq *xq,
                           int64_t gi, int64_t t0, const int T, __m256 *lo, __m256 *hi,
                           __m256 *accm) {
    const int L = xq->limbs;
    const int64_t K = xq->K, nb = xq->nb;
    __m256 ws8, mb8;
    group_scales(type, grp, n, &ws8, &mb8);
    __m256i cc[8][3];
    if (T > 1)
        for (int b = 0; b < n; b++) codes_of(type, grp, b, &cc[b][0], &cc[b][1], &cc[b][2]);
    for (int t = 0; t < T; t++) {
        const int64_t tt = t0 + t;
        const __m256 xs8 = load_n(xq->xs + tt * nb + gi * 8, n);
        group_token(type, n, grp, T > 1 ? (const __m256i (*)[3])cc : NULL,
                    xq->q + tt * L * K + gi * DS4N_INT_GROUP, K, L, _mm256_mul_ps(ws8, xs8),
                    _mm256_mul_ps(mb8, xs8), load_n(xq->bsum + tt * nb + gi * 8, n), &lo[t],
                    &hi[t], &accm[t]);
    }
}

DS4N_INLINE void int_row(int type, const uint8_t *w, const struct ds4n_xq *xq, int64_t t0, float *y,
                         int64_t ldy, const int T) {
    const int64_t nb = xq->nb, gb = ds4n_int_group_bytes(type);
    __m256 lo[DS4N_SMALL_T], hi[DS4N_SMALL_T], accm[DS4N_SMALL_T];
    for (int t = 0; t < T; t++) lo[t] = hi[t] = accm[t] = _mm256_setzero_ps();
    for (int64_t gi = 0; gi * 8 < nb; gi++) {
        /* n < 8 only in the last group of a row */
        const int n = nb - gi * 8 < 8 ? (int)(nb - gi * 8) : 8;
        if (n == 8) int_group(type, w + gi * gb, 8, xq, gi, t0, T, lo, hi, accm);
        else int_group(type, w + gi * gb, n, xq, gi, t0, T, lo, hi, accm);
    }
    for (int t = 0; t < T; t++) y[t * ldy] = finish(lo[t], hi[t], accm[t]);
}

/* Decode (ds4n_int_rows_fn) of the block-format types: R rows from R streams, group by group,
 * so the R streams are read in step; each row's steps are int_row's for T = 1, in its order,
 * so y[r] is bitwise the one-row kernel's. */
DS4N_INLINE void int_rows1(int type, const uint8_t *w, int64_t stride, const struct ds4n_xq *xq,
                           float *y, const int R) {
    const int64_t nb = xq->nb, gb = ds4n_int_group_bytes(type);
    __m256 lo[DS4N_MV_ROWS], hi[DS4N_MV_ROWS], accm[DS4N_MV_ROWS];
    for (int r = 0; r < R; r++) lo[r] = hi[r] = accm[r] = _mm256_setzero_ps();
    for (int64_t gi = 0; gi * 8 < nb; gi++) {
        const int n = nb - gi * 8 < 8 ? (int)(nb - gi * 8) : 8;
        for (int r = 0; r < R; r++) {
            const uint8_t *grp = w + r * stride + gi * gb;
            if (n == 8) int_group(type, grp, 8, xq, gi, 0, 1, &lo[r], &hi[r], &accm[r]);
            else int_group(type, grp, n, xq, gi, 0, 1, &lo[r], &hi[r], &accm[r]);
        }
    }
    for (int r = 0; r < R; r++) y[r] = finish(lo[r], hi[r], accm[r]);
}

/* ---- the super-block format (Q4_K, Q6_K; quants_int.h) ---------------------------------- */

/* Q4_K's d, dmin and 8 mins (as int32 in m); returns the 8 six-bit scales, a byte each. */
DS4N_INLINE uint64_t q4k_scales(const block_q4_K *p, float *d, float *dmin, __m256i *m) {
    uint64_t sc, mn;
    ds4n_k_scale_min8(p->scales, &sc, &mn);
    *d = _cvtsh_ss(p->d);
    *dmin = _cvtsh_ss(p->dmin);
    *m = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)mn));
    return sc;
}

/* Q4_K's vectors 4q .. 4q + 3 of 16 int16 code·scale (values 64q .. 64q + 63). */
DS4N_INLINE void q4k_quad(const block_q4_K *p, uint64_t sc, int q, __m256i w[4]) {
    const __m256i nib = _mm256_set1_epi8(0x0f);
    const __m256i z = _mm256_loadu_si256((const __m256i *)(p->qs + 32 * q));
    const __m256i l = _mm256_and_si256(z, nib), h = _mm256_and_si256(_mm256_srli_epi16(z, 4), nib);
    const __m256i s0 = _mm256_set1_epi16((short)(sc >> (16 * q) & 0xff));
    const __m256i s1 = _mm256_set1_epi16((short)(sc >> (16 * q + 8) & 0xff));
    w[0] = _mm256_mullo_epi16(_mm256_cvtepu8_epi16(_mm256_castsi256_si128(l)), s0);
    w[1] = _mm256_mullo_epi16(_mm256_cvtepu8_epi16(_mm256_extracti128_si256(l, 1)), s0);
    w[2] = _mm256_mullo_epi16(_mm256_cvtepu8_epi16(_mm256_castsi256_si128(h)), s1);
    w[3] = _mm256_mullo_epi16(_mm256_cvtepu8_epi16(_mm256_extracti128_si256(h, 1)), s1);
}

/* Q6_K's 6-bit codes (0..63) of half h as 4 vectors of 32 bytes: q[r] holds the values of
 * 16-groups 8h + 2r and 8h + 2r + 1. */
DS4N_INLINE void q6k_codes(const block_q6_K *p, int h, __m256i q[4]) {
    const __m256i nib = _mm256_set1_epi8(0x0f), hi2 = _mm256_set1_epi8(0x30);
    const __m256i l0 = _mm256_loadu_si256((const __m256i *)(p->ql + 64 * h));
    const __m256i l1 = _mm256_loadu_si256((const __m256i *)(p->ql + 64 * h + 32));
    const __m256i qh = _mm256_loadu_si256((const __m256i *)(p->qh + 32 * h));
    q[0] = _mm256_or_si256(_mm256_and_si256(l0, nib), _mm256_and_si256(_mm256_slli_epi16(qh, 4), hi2));
    q[1] = _mm256_or_si256(_mm256_and_si256(l1, nib), _mm256_and_si256(_mm256_slli_epi16(qh, 2), hi2));
    q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), nib), _mm256_and_si256(qh, hi2));
    q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), nib),
                           _mm256_and_si256(_mm256_srli_epi16(qh, 2), hi2));
}

/* Q6_K's vector v (the lower 16 bytes of q, or the upper: half) as int16 (code - 32)·scale. */
DS4N_INLINE __m256i q6k_vec(const block_q6_K *p, __m256i q, int half, int v) {
    const __m256i c = _mm256_cvtepu8_epi16(half ? _mm256_extracti128_si256(q, 1) : _mm256_castsi256_si128(q));
    return _mm256_mullo_epi16(_mm256_sub_epi16(c, _mm256_set1_epi16(32)), _mm256_set1_epi16(p->scales[v]));
}

/* A Q4_K or Q6_K super-block as 16 vectors of 16 int16 code·scale (vector v: values 16v ..
 * 16v + 15), its d (and Q4_K's dmin), and Q4_K's 8 mins as int32 in m. */
DS4N_INLINE void sb_weights(int type, const uint8_t *blk, __m256i w[16], float *d, float *dmin,
                            __m256i *m) {
    if (type == DS4N_Q4_K) {
        const block_q4_K *p = (const block_q4_K *)blk;
        const uint64_t sc = q4k_scales(p, d, dmin, m);
        for (int q = 0; q < 4; q++) q4k_quad(p, sc, q, w + 4 * q);
        return;
    }
    const block_q6_K *p = (const block_q6_K *)blk; /* DS4N_Q6_K */
    *d = _cvtsh_ss(p->d);
    *dmin = 0.0f;
    *m = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
        __m256i q[4];
        q6k_codes(p, h, q);
        for (int r = 0; r < 4; r++) {
            const int v = 8 * h + 2 * r; /* values 16v .. 16v + 31: 16-groups v, v + 1 */
            w[v] = q6k_vec(p, q[r], 0, v);
            w[v + 1] = q6k_vec(p, q[r], 1, v + 1);
        }
    }
}

/* Σ over a group of w·a, lane for lane: lo (lanes 0..7, the even vectors) and hi (the odd
 * ones). Exact int32 (quants_int.h bounds it), so the chains' order is free. */
DS4N_INLINE void sb_dot(const __m256i w[16], const int16_t *a, __m256i *lo, __m256i *hi) {
    __m256i s[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                    _mm256_setzero_si256()};
    for (int v = 0; v < 16; v++)
        s[v % 4] = _mm256_add_epi32(s[v % 4], _mm256_madd_epi16(w[v], _mm256_loadu_si256((const __m256i *)(a + 16 * v))));
    *lo = _mm256_add_epi32(s[0], s[2]);
    *hi = _mm256_add_epi32(s[1], s[3]);
}

/* One token against one super-block, its weights unpacked as they are used (16 vectors do
 * not fit beside the sums in AVX2's 16 registers; one token has no use for them after):
 * the lane sums of limb 0 in *s0 (lo, hi), of limb 1 (nl = 2) in *s1, each vector's product
 * exactly sb_weights' w[v] times the activations, so the sums are sb_dot's. */
DS4N_INLINE void sb_fused(int type, const uint8_t *blk, const int16_t *a, int64_t lda, int nl,
                          __m256i s0[2], __m256i s1[2], float *d, float *dmin, __m256i *m) {
    __m256i c0[4], c1[4];
    for (int i = 0; i < 4; i++) c0[i] = c1[i] = _mm256_setzero_si256();
#define SB_STEP(v, wv)                                                                         \
    do {                                                                                       \
        const __m256i w_ = (wv);                                                               \
        c0[(v) % 4] = _mm256_add_epi32(c0[(v) % 4], _mm256_madd_epi16(w_, _mm256_loadu_si256((const __m256i *)(a + 16 * (v))))); \
        if (nl == 2)                                                                           \
            c1[(v) % 4] = _mm256_add_epi32(c1[(v) % 4], _mm256_madd_epi16(w_, _mm256_loadu_si256((const __m256i *)(a + lda + 16 * (v))))); \
    } while (0)
    if (type == DS4N_Q4_K) {
        const block_q4_K *p = (const block_q4_K *)blk;
        const uint64_t sc = q4k_scales(p, d, dmin, m);
        _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) {
            __m256i w[4];
            q4k_quad(p, sc, q, w);
            SB_STEP(4 * q, w[0]);
            SB_STEP(4 * q + 1, w[1]);
            SB_STEP(4 * q + 2, w[2]);
            SB_STEP(4 * q + 3, w[3]);
        }
    } else { /* DS4N_Q6_K */
        const block_q6_K *p = (const block_q6_K *)blk;
        *d = _cvtsh_ss(p->d);
        *dmin = 0.0f;
        *m = _mm256_setzero_si256();
        /* unrolled: the sums' indices must be constants to stay in registers */
        _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
            __m256i q[4];
            q6k_codes(p, h, q);
            _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++) {
                const int v = 8 * h + 2 * r;
                SB_STEP(v, q6k_vec(p, q[r], 0, v));
                SB_STEP(v + 1, q6k_vec(p, q[r], 1, v + 1));
            }
        }
    }
#undef SB_STEP
    s0[0] = _mm256_add_epi32(c0[0], c0[2]), s0[1] = _mm256_add_epi32(c0[1], c0[3]);
    s1[0] = _mm256_add_epi32(c1[0], c1[2]), s1[1] = _mm256_add_epi32(c1[1], c1[3]);
}

/* The byte-split form of sb_fused (one token, T = 1): the activations as quants_int.h's byte
 * planes (a = 256·h + l, l unsigned, h signed) and the weights as bytes, the codes alone
 * (Q4_K 0..15, Q6_K 0..63) without their scales: per vector of 32 values and limb,
 *   pl = VPMADDUBSW(l, c), ph = VPMADDUBSW(c, h)   int16 pair sums: lane m = values 2m, 2m+1;
 *   VPMADDWD(unpack(pl, ph), (s, 256·s))            int32: s·(pl + 256·ph) = s·Σ c·a per pair,
 * the unpack (in-lane: pairs 0..3, 8..11 then 4..7, 12..15) pairing each lane's l and h sums
 * so that one VPMADDWD widens, applies the sub-block scale s and the 2^8 of h. Q6_K's codes
 * carry a bias of 32, taken off before the widening: pl - 32·Σl and ph - 32·Σh over the pair
 * (the planes' pc, in the unpack's order), so the sum is s·Σ (c - 32)·a as sb_weights' w.
 * Bounds (no saturation, no wrap): pl <= 2·255·63 = 32130, |ph| <= 2·63·128 = 16128; Q6_K's
 * pl - 32·Σl in [-16320, 32130], ph - 32·Σh in [-24320, 24194]; 256·s fits int16 (Q4_K s <= 63:
 * 16128; Q6_K s in -128..127: -32768..32512). Every lane sum is the exact integer sb_fused
 * gets, in another order of the (exact) additions; lanes come out permuted and are put back
 * in order once per super-block. */
DS4N_INLINE void sb_bytes_step(const __m256i c, const __m256i k, int q6, const uint8_t *lo,
                               int64_t lda, const int16_t *pc, __m256i *X, __m256i *Y) {
    const __m256i pl = _mm256_maddubs_epi16(_mm256_loadu_si256((const __m256i *)lo), c);
    const __m256i ph = _mm256_maddubs_epi16(c, _mm256_loadu_si256((const __m256i *)(lo + lda)));
    __m256i u = _mm256_unpacklo_epi16(pl, ph), v = _mm256_unpackhi_epi16(pl, ph);
    if (q6) { /* the bias: the pair sums of l and h, times 32, in the unpack's order */
        u = _mm256_sub_epi16(u, _mm256_loadu_si256((const __m256i *)pc));
        v = _mm256_sub_epi16(v, _mm256_loadu_si256((const __m256i *)(pc + 16)));
    }
    *X = _mm256_add_epi32(*X, _mm256_madd_epi16(u, k));
    *Y = _mm256_add_epi32(*Y, _mm256_madd_epi16(v, k));
}

/* One token against one super-block in the byte form (above): ab is the token's limb-0
 * low-byte plane (ds4n_xq_lo), o the group's first value; the lane sums as sb_fused's, in s0
 * (lo, hi) and s1. */
DS4N_INLINE void sb_fused_bytes(int type, const uint8_t *blk, const uint8_t *ab, int64_t o,
                                int64_t lda, int nl, __m256i s0[2], __m256i s1[2], float *d,
                                float *dmin, __m256i *m) {
    const int16_t *pc = (const int16_t *)(ab + 2 * lda) + o;
    ab += o;
    __m256i X0 = _mm256_setzero_si256(), Y0 = X0, X1 = X0, Y1 = X0;
#define SB_BSTEP(i, c, k, q6)                                                                  \
    do {                                                                                       \
        sb_bytes_step((c), (k), (q6), ab + 32 * (i), lda, pc + 32 * (i), &X0, &Y0);            \
        if (nl == 2)                                                                           \
            sb_bytes_step((c), (k), (q6), ab + 4 * lda + 32 * (i), lda, pc + 2 * lda + 32 * (i), \
                          &X1, &Y1);                                                           \
    } while (0)
    if (type == DS4N_Q4_K) {
        const block_q4_K *p = (const block_q4_K *)blk;
        const uint64_t sc = q4k_scales(p, d, dmin, m);
        const __m256i nib = _mm256_set1_epi8(0x0f);
        _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) {
            const __m256i z = _mm256_loadu_si256((const __m256i *)(p->qs + 32 * q));
            const int s0_ = (int)(sc >> (16 * q) & 0xff), s1_ = (int)(sc >> (16 * q + 8) & 0xff);
            /* (s, 256·s) as one int32: s + 2^24·s, s <= 63 */
            SB_BSTEP(2 * q, _mm256_and_si256(z, nib), _mm256_set1_epi32(s0_ | s0_ << 24), 0);
            SB_BSTEP(2 * q + 1, _mm256_and_si256(_mm256_srli_epi16(z, 4), nib),
                     _mm256_set1_epi32(s1_ | s1_ << 24), 0);
        }
    } else { /* DS4N_Q6_K */
        const block_q6_K *p = (const block_q6_K *)blk;
        *d = _cvtsh_ss(p->d);
        *dmin = 0.0f;
        *m = _mm256_setzero_si256();
        /* (s, 256·s) of the 16 scales as int32, in the unpack's order: kl holds scales
         * 0..3 | 8..11, kh 4..7 | 12..15 */
        const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p->scales));
        const __m256i t16 = _mm256_slli_epi16(s16, 8);
        const __m256i kl = _mm256_unpacklo_epi16(s16, t16), kh = _mm256_unpackhi_epi16(s16, t16);
        _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
            __m256i q[4];
            q6k_codes(p, h, q);
            _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++) {
                /* scales v = 8h + 2r (values 16v ..) and v + 1: lanes of kl (v % 8 < 4) or kh */
                const int v = 8 * h + 2 * r, at = 4 * (v / 8) + v % 4;
                const __m256i idx = _mm256_setr_epi32(at, at, at, at, at + 1, at + 1, at + 1, at + 1);
                SB_BSTEP(4 * h + r, q[r], _mm256_permutevar8x32_epi32(v % 8 < 4 ? kl : kh, idx), 1);
            }
        }
    }
#undef SB_BSTEP
    /* X holds lanes 0..3 | 8..11, Y 4..7 | 12..15 */
    s0[0] = _mm256_permute2x128_si256(X0, Y0, 0x20), s0[1] = _mm256_permute2x128_si256(X0, Y0, 0x31);
    s1[0] = _mm256_permute2x128_si256(X1, Y1, 0x20), s1[1] = _mm256_permute2x128_si256(X1, Y1, 0x31);
}

/* ds4n_sb_group_ref's float steps, in its order, from the lane sums s0 (limb 0) and s1. */
DS4N_INLINE void sb_float(int type, const __m256i s0[2], const __m256i s1[2], int nl, float d,
                          float dmin, __m256i m, float xs, const int32_t *as, int64_t nb,
                          __m256 *lo, __m256 *hi) {
    const __m256 third = _mm256_set1_ps(0x1p-7f);
    __m256 f0 = _mm256_cvtepi32_ps(s0[0]), f1 = _mm256_cvtepi32_ps(s0[1]);
    if (nl == 2) {
        f0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s1[0]), third, f0);
        f1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s1[1]), third, f1);
    }
    const __m256 D = _mm256_set1_ps(d * xs);
    *lo = _mm256_fmadd_ps(f0, D, *lo);
    *hi = _mm256_fmadd_ps(f1, D, *hi);
    if (type == DS4N_Q4_K) {
        __m256 mm = _mm256_cvtepi32_ps(_mm256_mullo_epi32(m, _mm256_loadu_si256((const __m256i *)as)));
        if (nl == 2)
            mm = _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(_mm256_mullo_epi32(m, _mm256_loadu_si256((const __m256i *)(as + nb)))),
                third, mm);
        *lo = _mm256_fnmadd_ps(mm, _mm256_set1_ps(dmin * xs), *lo);
    }
}

/* One token against super-block blk (unpacked as used, in the byte form: ab, the token's
 * limb-0 low-byte plane, o the group's first value), into lo and hi. */
DS4N_INLINE void sb_token1(int type, const uint8_t *blk, const uint8_t *ab, int64_t o, int64_t lda,
                           int nl, float xs, const int32_t *as, int64_t nb, __m256 *lo, __m256 *hi) {
    __m256i s0[2], s1[2], m;
    float d, dmin;
    sb_fused_bytes(type, blk, ab, o, lda, nl, s0, s1, &d, &dmin, &m);
    sb_float(type, s0, s1, nl, d, dmin, m, xs, as, nb, lo, hi);
}

/* One token against super-block blk from the int16 limbs (a at the group): a prefill chunk's
 * lone token, whose xq has no byte planes (ds4n_xq_init makes them for decode and small
 * batches only). */
DS4N_INLINE void sb_token1_int16(int type, const uint8_t *blk, const int16_t *a, int64_t lda,
                                 int nl, float xs, const int32_t *as, int64_t nb, __m256 *lo,
                                 __m256 *hi) {
    __m256i s0[2], s1[2], m;
    float d, dmin;
    sb_fused(type, blk, a, lda, nl, s0, s1, &d, &dmin, &m);
    sb_float(type, s0, s1, nl, d, dmin, m, xs, as, nb, lo, hi);
}

/* One super-block (unpacked: W, d, dmin, m) against one token's limbs a (stride lda), its xs
 * and block sums as, into lo and hi: ds4n_sb_group_ref's float steps in its order. */
DS4N_INLINE void sb_token(int type, const __m256i W[16], float d, float dmin, __m256i m,
                          const int16_t *a, int64_t lda, int nl, float xs, const int32_t *as,
                          int64_t nb, __m256 *lo, __m256 *hi) {
    __m256i s0[2], s1[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    sb_dot(W, a, &s0[0], &s0[1]);
    if (nl == 2) sb_dot(W, a + lda, &s1[0], &s1[1]);
    sb_float(type, s0, s1, nl, d, dmin, m, xs, as, nb, lo, hi);
}

/* Groups [g0, g1) of row w against tokens t0 .. t0 + T - 1, into lo[T] and hi[T]. */
DS4N_INLINE void sb_groups(int type, const uint8_t *w, const struct ds4n_xq *xq, int64_t g0,
                           int64_t g1, int64_t t0, __m256 *lo, __m256 *hi, const int T) {
    const int nl = xq->limbs - 1;
    const int64_t nb = xq->nb, ng = nb / 8;
    const int64_t bb = type == DS4N_Q4_K ? (int64_t)sizeof(block_q4_K) : (int64_t)sizeof(block_q6_K);
    if (T == 1) { /* one token: the weights unpacked as they are used */
        for (int64_t g = g0; g < g1; g++)
            if (xq->ab)
                sb_token1(type, w + g * bb, ds4n_xq_lo(xq, t0, 0), g * DS4N_INT_GROUP, xq->lda, nl,
                          xq->xs[t0 * ng + g], xq->asum + t0 * nl * nb + 8 * g, nb, &lo[0], &hi[0]);
            else
                sb_token1_int16(type, w + g * bb, xq->a + t0 * nl * xq->lda + g * DS4N_INT_GROUP,
                                xq->lda, nl, xq->xs[t0 * ng + g], xq->asum + t0 * nl * nb + 8 * g,
                                nb, &lo[0], &hi[0]);
        return;
    }
    /* Several tokens: the int16 products, the weights unpacked once (16 vectors of code·scale)
     * for all. The byte form was measured slower here (docs/integer-path.md): per token it
     * takes two VPMADDUBSW, two unpacks and two VPMADDWD where the int16 form takes two
     * VPMADDWD, and its saving, the weights' unpacking, is shared by the tokens anyway. */
    for (int64_t g = g0; g < g1; g++) {
        __m256i W[16], m;
        float d, dmin;
        sb_weights(type, w + g * bb, W, &d, &dmin, &m);
        for (int t = 0; t < T; t++) {
            const int64_t tt = t0 + t;
            sb_token(type, W, d, dmin, m, xq->a + tt * nl * xq->lda + g * DS4N_INT_GROUP, xq->lda,
                     nl, xq->xs[tt * ng + g], xq->asum + tt * nl * nb + 8 * g, nb, &lo[t], &hi[t]);
        }
    }
}

DS4N_INLINE void sb_row(int type, const uint8_t *w, const struct ds4n_xq *xq, int64_t t0,
                        float *y, int64_t ldy, const int T) {
    __m256 lo[DS4N_SMALL_T], hi[DS4N_SMALL_T];
    for (int t = 0; t < T; t++) lo[t] = hi[t] = _mm256_setzero_ps();
    sb_groups(type, w, xq, 0, xq->nb / 8, t0, lo, hi, T);
    for (int t = 0; t < T; t++) y[t * ldy] = hsum16(lo[t], hi[t]);
}

/* The prefill step (ds4n_sb_part_fn): the accumulators carried in memory (acc + 16t: lo, hi). */
DS4N_INLINE void sb_part(int type, const uint8_t *w, const struct ds4n_xq *xq, int64_t g0,
                         int64_t g1, int64_t t0, float *accmem, float *y, int64_t ldy,
                         const int T) {
    __m256 lo[DS4N_SMALL_T], hi[DS4N_SMALL_T];
    for (int t = 0; t < T; t++) {
        lo[t] = g0 == 0 ? _mm256_setzero_ps() : _mm256_load_ps(accmem + 16 * t);
        hi[t] = g0 == 0 ? _mm256_setzero_ps() : _mm256_load_ps(accmem + 16 * t + 8);
    }
    sb_groups(type, w, xq, g0, g1, t0, lo, hi, T);
    for (int t = 0; t < T; t++) {
        if (y) {
            y[t * ldy] = hsum16(lo[t], hi[t]);
        } else {
            _mm256_store_ps(accmem + 16 * t, lo[t]);
            _mm256_store_ps(accmem + 16 * t + 8, hi[t]);
        }
    }
}

/* Decode (ds4n_int_rows_fn): R rows from R streams, super-block by super-block, so the R
 * streams are read in step; each row's steps are sb_groups' for T = 1, in its order, so y[r]
 * is bitwise the one-row kernel's. */
DS4N_INLINE void sb_rows1(int type, const uint8_t *w, int64_t stride, const struct ds4n_xq *xq,
                          float *y, const int R) {
    const int nl = xq->limbs - 1;
    const int64_t nb = xq->nb, ng = nb / 8;
    const int64_t bb = type == DS4N_Q4_K ? (int64_t)sizeof(block_q4_K) : (int64_t)sizeof(block_q6_K);
    __m256 lo[DS4N_MV_ROWS], hi[DS4N_MV_ROWS];
    for (int r = 0; r < R; r++) lo[r] = hi[r] = _mm256_setzero_ps();
    if (!xq->ab) { /* not from the engine (decode's xq has the planes): row by row */
        for (int r = 0; r < R; r++) sb_row(type, w + r * stride, xq, 0, y + r, 1, 1);
        return;
    }
    for (int64_t g = 0; g < ng; g++)
        for (int r = 0; r < R; r++)
            sb_token1(type, w + r * stride + g * bb, ds4n_xq_lo(xq, 0, 0), g * DS4N_INT_GROUP, xq->lda, nl,
                      xq->xs[g], xq->asum + 8 * g, nb, &lo[r], &hi[r]);
    for (int r = 0; r < R; r++) y[r] = hsum16(lo[r], hi[r]);
}

/* ---- the prefill tile (ds4n_sb_tile_fn) -------------------------------------------------- */

static void sb_unpack(int type, const uint8_t *row, struct ds4n_sb_panel *p, int64_t i) {
    const int64_t bb = type == DS4N_Q4_K ? (int64_t)sizeof(block_q4_K) : (int64_t)sizeof(block_q6_K);
    for (int64_t g = 0; g < p->ng; g++) {
        const int64_t at = i * p->ng + g;
        __m256i W[16], m;
        sb_weights(type, row + g * bb, W, &p->d[at], &p->dmin[at], &m);
        for (int v = 0; v < 16; v++) _mm256_store_si256((__m256i *)(p->w + at * DS4N_INT_GROUP + 16 * v), W[v]);
        _mm256_store_si256((__m256i *)(p->m + 8 * at), m);
    }
}

/* The R·C lane sums of one half (0: lo, the even vectors; 1: hi) of super-block g, limb k:
 * each weight vector loaded once for the C tokens, each activation vector once for the R rows
 * (2·4 int32 sums, 2 weights and 1 activation: 11 of the 16 ymm). */
DS4N_INLINE void tile_half(const int16_t *w, int64_t wstride, const int16_t *a, int64_t astride,
                           int half, __m256i s[DS4N_SB_TILE_R][DS4N_SB_TILE_C], const int R,
                           const int C) {
    for (int r = 0; r < R; r++)
        for (int t = 0; t < C; t++) s[r][t] = _mm256_setzero_si256();
    for (int v = half; v < 16; v += 2) {
        __m256i W[DS4N_SB_TILE_R];
        for (int r = 0; r < R; r++) W[r] = _mm256_load_si256((const __m256i *)(w + r * wstride + 16 * v));
        for (int t = 0; t < C; t++) {
            /* In a register: a compiler would otherwise fold the load into each of the R
             * products, R loads where one does. */
            __m256i A = _mm256_loadu_si256((const __m256i *)(a + t * astride + 16 * v));
            if (R > 1) __asm__("" : "+x"(A));
            for (int r = 0; r < R; r++) s[r][t] = _mm256_add_epi32(s[r][t], _mm256_madd_epi16(W[r], A));
        }
    }
}

/* R rows x C tokens (constants) over groups [g0, g1): per super-block the lane sums of each
 * half (and limb) in registers, then each (row, token) takes ds4n_sb_group_ref's float steps
 * in its order (per lane: the d step, then Q4_K's mins on lanes 0..7). NL: activation limbs
 * (1: int2, 2: int3). The accumulators live in accmem's layout ((r·C_max + t)·16: lo, hi). */
DS4N_INLINE void sb_tile_rc(int type, const struct ds4n_sb_panel *p, int64_t i0,
                            const struct ds4n_xq *xq, int64_t t0, int64_t g0, int64_t g1,
                            float *accmem, float *y, int64_t ldy, const int R, const int C,
                            const int NL) {
    const int64_t ng = p->ng, nb = xq->nb, lda = xq->lda;
    const __m256 third = _mm256_set1_ps(0x1p-7f);
    _Alignas(32) float acc[DS4N_SB_TILE_R][DS4N_SB_TILE_C][16];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < C; t++)
            for (int h = 0; h < 2; h++)
                _mm256_store_ps(acc[r][t] + 8 * h,
                                g0 == 0 ? _mm256_setzero_ps()
                                        : _mm256_load_ps(accmem + (r * DS4N_SB_TILE_C + t) * 16 + 8 * h));
    for (int64_t g = g0; g < g1; g++) {
        const int16_t *w = p->w + (i0 * ng + g) * DS4N_INT_GROUP;
        const int16_t *a = xq->a + t0 * NL * lda + g * DS4N_INT_GROUP;
        float D[DS4N_SB_TILE_R][DS4N_SB_TILE_C], Dm[DS4N_SB_TILE_R][DS4N_SB_TILE_C];
        for (int r = 0; r < R; r++)
            for (int t = 0; t < C; t++) {
                const float xs = xq->xs[(t0 + t) * (nb / 8) + g];
                D[r][t] = p->d[(i0 + r) * ng + g] * xs;
                Dm[r][t] = p->dmin[(i0 + r) * ng + g] * xs;
            }
        for (int h = 0; h < 2; h++) {
            __m256i s[DS4N_SB_TILE_R][DS4N_SB_TILE_C], s1[DS4N_SB_TILE_R][DS4N_SB_TILE_C];
            tile_half(w, ng * DS4N_INT_GROUP, a, NL * lda, h, s, R, C);
            if (NL == 2) tile_half(w, ng * DS4N_INT_GROUP, a + lda, NL * lda, h, s1, R, C);
            for (int r = 0; r < R; r++) {
                __m256i m = _mm256_setzero_si256();
                if (type == DS4N_Q4_K && h == 0)
                    m = _mm256_load_si256((const __m256i *)(p->m + 8 * ((i0 + r) * ng + g)));
                for (int t = 0; t < C; t++) {
                    __m256 f = _mm256_cvtepi32_ps(s[r][t]);
                    if (NL == 2) f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s1[r][t]), third, f);
                    __m256 x = _mm256_fmadd_ps(f, _mm256_set1_ps(D[r][t]), _mm256_load_ps(acc[r][t] + 8 * h));
                    if (type == DS4N_Q4_K && h == 0) {
                        const int32_t *as = xq->asum + (t0 + t) * NL * nb + 8 * g;
                        __m256 mm = _mm256_cvtepi32_ps(_mm256_mullo_epi32(m, _mm256_loadu_si256((const __m256i *)as)));
                        if (NL == 2)
                            mm = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_mullo_epi32(
                                                     m, _mm256_loadu_si256((const __m256i *)(as + nb)))),
                                                 third, mm);
                        x = _mm256_fnmadd_ps(mm, _mm256_set1_ps(Dm[r][t]), x);
                    }
                    _mm256_store_ps(acc[r][t] + 8 * h, x);
                }
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < C; t++) {
            const __m256 lo = _mm256_load_ps(acc[r][t]), hi = _mm256_load_ps(acc[r][t] + 8);
            if (y) {
                y[t * ldy + r] = hsum16(lo, hi);
            } else {
                _mm256_store_ps(accmem + (r * DS4N_SB_TILE_C + t) * 16, lo);
                _mm256_store_ps(accmem + (r * DS4N_SB_TILE_C + t) * 16 + 8, hi);
            }
        }
}

#define SB_TILE_CASE(R_, C_, type, NL_)                                                        \
    case (R_) * 8 + (C_):                                                                      \
        sb_tile_rc(type, p, i0, xq, t0, g0, g1, acc, y, ldy, R_, C_, NL_);                     \
        break;
#define SB_TILE_ROWS(R_, type, NL_)                                                            \
    SB_TILE_CASE(R_, 1, type, NL_) SB_TILE_CASE(R_, 2, type, NL_)                              \
    SB_TILE_CASE(R_, 3, type, NL_) SB_TILE_CASE(R_, 4, type, NL_)
#define SB_TILE_SWITCH(type, NL_)                                                              \
    switch (R * 8 + C) {                                                                       \
        SB_TILE_ROWS(1, type, NL_)                                                             \
        SB_TILE_ROWS(2, type, NL_)                                                             \
    default: break;                                                                            \
    }
_Static_assert(DS4N_SB_TILE_R == 2 && DS4N_SB_TILE_C == 4,
               "tile_half keeps 2 x 4 sums in registers; SB_TILE_SWITCH covers up to 2 x 4");

static void sb_tile(int type, const struct ds4n_sb_panel *p, int64_t i0, int R,
                    const struct ds4n_xq *xq, int64_t t0, int C, int64_t g0, int64_t g1,
                    float *acc, float *y, int64_t ldy) {
    if (type == DS4N_Q4_K) {
        if (xq->limbs == 3) SB_TILE_SWITCH(DS4N_Q4_K, 2) else SB_TILE_SWITCH(DS4N_Q4_K, 1)
    } else {
        if (xq->limbs == 3) SB_TILE_SWITCH(DS4N_Q6_K, 2) else SB_TILE_SWITCH(DS4N_Q6_K, 1)
    }
}

/* ---- the kernel tables ----------------------------------------------------------------- */

DS4N_INT_ROWS_KERNEL(q8_0, DS4N_Q8_0, int_rows1)
DS4N_INT_ROWS_KERNEL(q4_0, DS4N_Q4_0, int_rows1)
DS4N_INT_ROWS_KERNEL(q4_1, DS4N_Q4_1, int_rows1)
DS4N_INT_ROWS_KERNEL(q4_K, DS4N_Q4_K, sb_rows1)
DS4N_INT_ROWS_KERNEL(q6_K, DS4N_Q6_K, sb_rows1)
DS4N_INT_ROW_KERNEL(q8_0, DS4N_Q8_0, int_row)
DS4N_INT_ROW_KERNEL(q4_0, DS4N_Q4_0, int_row)
DS4N_INT_ROW_KERNEL(q4_1, DS4N_Q4_1, int_row)
DS4N_INT_ROW_KERNEL(q4_K, DS4N_Q4_K, sb_row)
DS4N_INT_ROW_KERNEL(q6_K, DS4N_Q6_K, sb_row)
DS4N_INT_PART_KERNEL(q4_K, DS4N_Q4_K, sb_part)
DS4N_INT_PART_KERNEL(q6_K, DS4N_Q6_K, sb_part)

/* ---- the activation quantizer ---------------------------------------------------------- */

/* ds4n_sb_quantize_group in vectors: the same exact steps (round is rint, ties to even). */
static void sb_quantize_group(const float *x, int L, int16_t *a, int64_t K, float *xs,
                              int32_t *asum, int64_t nb) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 mx = _mm256_setzero_ps();
    int bad = 0;
    for (int j = 0; j < DS4N_INT_GROUP; j += 8) {
        const __m256 v = _mm256_and_ps(_mm256_loadu_ps(x + j), absmask);
        bad |= _mm256_movemask_ps(_mm256_cmp_ps(v, _mm256_set1_ps(FLT_MAX), _CMP_NLE_UQ)); /* inf, NaN */
        mx = _mm256_max_ps(mx, v);
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    if (bad || amax < DS4N_INT_TINY) {
        ds4n_sb_zero_group(L, a, K, xs, asum, nb, !bad);
        return;
    }
    uint32_t bits;
    memcpy(&bits, &amax, 4);
    const int E = (int)(bits >> 23) - 127;
    const __m256 inv = _mm256_set1_ps(ds4n_pow2f(14 - E));
    const __m256 top = _mm256_set1_ps(DS4N_SB_AMAX), bottom = _mm256_set1_ps(-DS4N_SB_AMAX);
#define RN (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
    for (int b = 0; b < 8; b++) {
        __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const int j = 32 * b + 16 * h;
            __m256i li[2], l1[2];
            for (int u = 0; u < 2; u++) {
                const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + j + 8 * u), inv);
                const __m256 l = _mm256_min_ps(_mm256_max_ps(_mm256_round_ps(v, RN), bottom), top);
                li[u] = _mm256_cvtps_epi32(l);
                s0 = _mm256_add_epi32(s0, li[u]);
                if (L == 3) {
                    l1[u] = _mm256_cvtps_epi32(
                        _mm256_round_ps(_mm256_mul_ps(_mm256_sub_ps(v, l), _mm256_set1_ps(128.0f)), RN));
                    s1 = _mm256_add_epi32(s1, l1[u]);
                }
            }
            /* packs is per 128-bit lane: the qword permute puts the 16 values in order */
            _mm256_storeu_si256((__m256i *)(a + j),
                                _mm256_permute4x64_epi64(_mm256_packs_epi32(li[0], li[1]), 0xd8));
            if (L == 3)
                _mm256_storeu_si256((__m256i *)(a + K + j),
                                    _mm256_permute4x64_epi64(_mm256_packs_epi32(l1[0], l1[1]), 0xd8));
        }
        __m128i r = _mm_add_epi32(_mm256_castsi256_si128(s0), _mm256_extracti128_si256(s0, 1));
        r = _mm_add_epi32(r, _mm_shuffle_epi32(r, 0x4e));
        asum[b] = _mm_cvtsi128_si32(_mm_add_epi32(r, _mm_shuffle_epi32(r, 0xb1)));
        if (L == 3) {
            r = _mm_add_epi32(_mm256_castsi256_si128(s1), _mm256_extracti128_si256(s1, 1));
            r = _mm_add_epi32(r, _mm_shuffle_epi32(r, 0x4e));
            asum[nb + b] = _mm_cvtsi128_si32(_mm_add_epi32(r, _mm_shuffle_epi32(r, 0xb1)));
        }
    }
    *xs = ds4n_pow2f(E - 14);
#undef RN
}

/* ds4n_sb_split_group in vectors: the same bytes and pair sums (the unpack here is the
 * kernels' unpack, so pc comes out in their order). */
static void sb_split_group(const int16_t *a, uint8_t *lo, int8_t *hi, int16_t *pc) {
    const __m256i ff = _mm256_set1_epi16(0xff), ones = _mm256_set1_epi8(1);
    for (int i = 0; i < DS4N_INT_GROUP / 32; i++) {
        const __m256i a0 = _mm256_loadu_si256((const __m256i *)(a + 32 * i));
        const __m256i a1 = _mm256_loadu_si256((const __m256i *)(a + 32 * i + 16));
        /* packs work per 128-bit lane: the qword permute puts the 32 bytes in order */
        const __m256i l = _mm256_permute4x64_epi64(
            _mm256_packus_epi16(_mm256_and_si256(a0, ff), _mm256_and_si256(a1, ff)), 0xd8);
        const __m256i h = _mm256_permute4x64_epi64(
            _mm256_packs_epi16(_mm256_srai_epi16(a0, 8), _mm256_srai_epi16(a1, 8)), 0xd8);
        _mm256_storeu_si256((__m256i *)(lo + 32 * i), l);
        _mm256_storeu_si256((__m256i *)(hi + 32 * i), h);
        const __m256i lp = _mm256_slli_epi16(_mm256_maddubs_epi16(l, ones), 5);
        const __m256i hp = _mm256_slli_epi16(_mm256_maddubs_epi16(ones, h), 5);
        _mm256_storeu_si256((__m256i *)(pc + 32 * i), _mm256_unpacklo_epi16(lp, hp));
        _mm256_storeu_si256((__m256i *)(pc + 32 * i + 16), _mm256_unpackhi_epi16(lp, hp));
    }
}

static DS4N_INT_DEFINE_QUANTIZE(xq_quantize, ds4n_int_quantize_block, sb_quantize_group, sb_split_group)

DS4N_INT_DEFINE_SET(ds4n_int_avx2, sb_tile, sb_unpack);
