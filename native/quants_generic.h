/* Type-generic SIMD row kernels, written once for every vector ISA. Included by each SIMD
 * kernel file (quants_avx2.c, quants_neon.c) after it defines, for its vector type:
 *
 *   vacc                  an accumulator vector;  vzero(), vadd(), vsub(), vhsum()
 *   vfma_s(acc, s, v)     acc + s·v (s a float);  vfma_m(acc, p, v)  the same with s = *p in
 *                         memory (a broadcast operand where the ISA has one)
 *   v16                   16 floats in registers
 *   v16_dot(q, x)         Σ q·x over x[0..16), as a vector;   v16_sum(x)  Σ x, as a vector
 *   v16_fma(acc, q, x)    acc + that Σ q·x
 *   v16_store(y, q, d)    y = d·q;   v16_store_affine(y, q, d, m)  y = d·q + m (no FMA)
 *   f16(h)                half -> float;  f16_pairs(p, stride, R, out)  the two halves at
 *                         p + r*stride, r < R, as out[2r], out[2r+1]
 *   dequant_float(), dot_float()   for F32/F16/BF16 rows
 *   codes producers, 32 codes (as 2 x v16) of:
 *     legacy_codes(qs, qh or NULL, offset, q)  Q4_0/Q4_1/Q5_0/Q5_1;  q8_codes(qs, q)
 *     k45_codes(qs, qh or NULL, s, q)          sub-block s of Q4_K/Q5_K
 *     q6_codes(block, h, r, q)                 32-group r of half h of Q6_K, offset removed
 *     k23_codes(qs, hmask or NULL, h, j, q)    plane j of half h of Q2_K/Q3_K
 *     iq2_codes(idx, meta, q)                  a 32-group of IQ2_XXS, signs applied
 *     nibble_codes(qs, table, q)               table[nibble] of 16 bytes, low nibbles first
 *                                              (IQ4_NL, IQ4_XS, MXFP4)
 *
 * Dequantizers do the scalar kernels' products in the same order without fusing, so they
 * are bit-identical to them; dots apply each block's scales once to Σq·x (and its min to Σx).
 * The multi-row matvecs (rows_*) run R rows of a decode matvec in one pass over x. */
#ifndef DS4N_QUANTS_GENERIC_H
#define DS4N_QUANTS_GENERIC_H

/* ---- 32-value blocks of one scale: the legacy types, IQ4_NL and MXFP4 ----------------- */

struct legacy_block {
    float d, m;
    v16 q[2];
};

static inline int is_affine(int type) { return type == DS4N_Q4_1 || type == DS4N_Q5_1; }

DS4N_INLINE void load_legacy(int type, const void *blk, struct legacy_block *b) {
    b->m = 0.0f;
    switch (type) {
    case DS4N_Q4_0: {
        const block_q4_0 *p = blk;
        b->d = f16(p->d);
        legacy_codes(p->qs, NULL, 8, b->q);
        break;
    }
    case DS4N_Q4_1: {
        const block_q4_1 *p = blk;
        b->d = f16(p->d), b->m = f16(p->m);
        legacy_codes(p->qs, NULL, 0, b->q);
        break;
    }
    case DS4N_Q5_0: {
        const block_q5_0 *p = blk;
        b->d = f16(p->d);
        legacy_codes(p->qs, p->qh, 16, b->q);
        break;
    }
    case DS4N_Q5_1: {
        const block_q5_1 *p = blk;
        b->d = f16(p->d), b->m = f16(p->m);
        legacy_codes(p->qs, p->qh, 0, b->q);
        break;
    }
    case DS4N_IQ4_NL: {
        const block_iq4_nl *p = blk;
        b->d = f16(p->d);
        nibble_codes(p->qs, ds4n_iq4nl_values, b->q);
        break;
    }
    case DS4N_MXFP4: {
        const block_mxfp4 *p = blk;
        b->d = ds4n_e8m0_to_f32_half(p->e);
        nibble_codes(p->qs, ds4n_mxfp4_values, b->q);
        break;
    }
    default: { /* DS4N_Q8_0 */
        const block_q8_0 *p = blk;
        b->d = f16(p->d);
        q8_codes(p->qs, b->q);
    }
    }
}

DS4N_INLINE void dequant_legacy(int type, int64_t block_bytes, const void *src, float *y,
                                int64_t n) {
    const uint8_t *p = src;
    struct legacy_block b;
    for (int64_t i = 0; i < n / QK; i++, p += block_bytes, y += QK) {
        load_legacy(type, p, &b);
        for (int h = 0; h < 2; h++) {
            if (is_affine(type)) v16_store_affine(y + 16 * h, b.q[h], b.d, b.m);
            else v16_store(y + 16 * h, b.q[h], b.d);
        }
    }
}

DS4N_INLINE float dot_legacy(int type, int64_t block_bytes, const void *w, const float *x,
                             int64_t n) {
    const uint8_t *p = w;
    vacc acc = vzero(), accm = vzero();
    struct legacy_block b;
    for (int64_t i = 0; i < n / QK; i++, p += block_bytes, x += QK) {
        load_legacy(type, p, &b);
        acc = vfma_s(acc, b.d, vadd(v16_dot(b.q[0], x), v16_dot(b.q[1], x + 16)));
        if (is_affine(type)) accm = vfma_s(accm, b.m, vadd(v16_sum(x), v16_sum(x + 16)));
    }
    return vhsum(vadd(acc, accm));
}

/* Σq·x over one 32-value block, as a vector: one multiply and three FMAs. */
DS4N_INLINE vacc block32_dot(const v16 q[2], const float *x) {
    return v16_fma(v16_dot(q[0], x), q[1], x + 16);
}

DS4N_INLINE void rows_legacy(int type, int64_t block_bytes, const void *w, int64_t row_stride,
                             const float *x, const float *xsum, int64_t n, float *y,
                             const int R) {
    vacc acc[DS4N_MV_ROWS];
    float accm[DS4N_MV_ROWS];
    for (int r = 0; r < R; r++) acc[r] = vzero(), accm[r] = 0.0f;
    const uint8_t *p = w;
    struct legacy_block b;
    /* The f16 scales (and min) of the R rows' blocks converted together; MXFP4's is a byte. */
    const int pairs = type != DS4N_MXFP4;
    float dm[2 * DS4N_MV_ROWS];
    int64_t i = 0;
#ifdef DS4N_F16_QUADS
    /* Four blocks' halves of the R rows in one gather and two conversions. */
    if (pairs && f16_quads_fit(block_bytes, row_stride)) {
        float dm4[4][2 * DS4N_MV_ROWS];
        for (; i + 4 <= n / QK; i += 4) {
#ifdef DS4N_ROWS_LEAD
            for (int r = 0; r < R; r++) ds4n_prefetch_ahead(p + r * row_stride, 4 * block_bytes);
#endif
            f16_quads(p, block_bytes, row_stride, R, dm4);
            for (int k = 0; k < 4; k++, p += block_bytes, x += QK)
                for (int r = 0; r < R; r++) {
                    load_legacy(type, p + r * row_stride, &b);
                    acc[r] = vfma_m(acc[r], &dm4[k][2 * r], block32_dot(b.q, x));
                    if (is_affine(type)) accm[r] += dm4[k][2 * r + 1] * xsum[i + k];
                }
        }
    }
#endif
    for (; i < n / QK; i++, p += block_bytes, x += QK) {
#ifdef DS4N_ROWS_LEAD
        for (int r = 0; r < R; r++) ds4n_prefetch_ahead(p + r * row_stride, block_bytes);
#endif
        if (pairs) f16_pairs(p, row_stride, R, dm);
        for (int r = 0; r < R; r++) {
            load_legacy(type, p + r * row_stride, &b);
            const vacc s = block32_dot(b.q, x);
            acc[r] = pairs ? vfma_m(acc[r], &dm[2 * r], s) : vfma_s(acc[r], b.d, s);
            if (is_affine(type)) accm[r] += dm[2 * r + 1] * xsum[i];
        }
    }
    for (int r = 0; r < R; r++) y[r] = vhsum(acc[r]) + accm[r];
}

/* Accumulator vectors a small-batch tile keeps in registers (the set may say how many: it
 * leaves room for a row's decoded block and the x operands). */
#ifndef DS4N_TILE_ACC
#define DS4N_TILE_ACC 16
#endif

/* Eight tokens' floats (the min terms of a tile row: lane t is token t's). A vector type
 * of the compiler's, not an intrinsic: `a += m * v` on it is contracted into an FMA exactly
 * when the rows kernel's scalar `accm += m * xsum` is (the same expression, per lane). */
typedef float ds4n_tok8 __attribute__((vector_size(32)));

/* Tokens t0 .. t0+G of tile_legacy: each block of the R rows decoded once, each token's 32
 * values of x read from L1 for every row, R·G accumulators in registers. xs: the block-major
 * per-32 sums (xs[i*T + t], T the batch's token count, 8 floats readable from any t). */
DS4N_INLINE void tile_legacy_pass(int type, int64_t block_bytes, const uint8_t *w,
                                  int64_t row_stride, const float *x, int64_t ldx,
                                  const float *xs, int T, int64_t n, float *y, int64_t ldy,
                                  const int R, const int G) {
    vacc acc[DS4N_TILE_ACC]; /* row r, token t at r*G + t */
    ds4n_tok8 accm[DS4N_MV_ROWS];
    for (int r = 0; r < R; r++) {
        accm[r] = (ds4n_tok8){0};
        for (int t = 0; t < G; t++) acc[r * G + t] = vzero();
    }
    /* Each row's scale and min converted on its own (load_legacy): a tile shares them between
     * G tokens, and f16_pairs' parking store made GCC keep the accumulators in memory. */
    struct legacy_block b;
    const uint8_t *p = w;
    for (int64_t i = 0; i < n / QK; i++, p += block_bytes, x += QK, xs += T) {
        ds4n_tok8 xsv;
        if (is_affine(type)) memcpy(&xsv, xs, sizeof xsv);
        for (int r = 0; r < R; r++) {
            load_legacy(type, p + r * row_stride, &b);
            for (int t = 0; t < G; t++) {
                const vacc s = block32_dot(b.q, x + t * ldx);
                acc[r * G + t] = vfma_s(acc[r * G + t], b.d, s);
            }
            if (is_affine(type)) accm[r] += b.m * xsv; /* rows_legacy's expression */
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < G; t++) y[t * ldy + r] = vhsum(acc[r * G + t]) + accm[r][t];
}

/* rows_legacy's arithmetic for R rows and T tokens. The tokens go in as few passes over the
 * rows as keep R·G accumulators within the set's DS4N_TILE_ACC (each pass decodes the blocks
 * again), G as even as can be. */
DS4N_INLINE void tile_legacy(int type, int64_t block_bytes, const void *w, int64_t row_stride,
                             const float *x, int64_t ldx, const float *xsum, int64_t n,
                             float *y, int64_t ldy, const int R, const int T) {
    const int most = DS4N_TILE_ACC / R, passes = (T + most - 1) / most;
    const int G = (T + passes - 1) / passes; /* <= most */
    const float *xs = xsum + T * (n / QK);
    /* written out, so that every pass's token count is a constant */
#define DS4N_LEGACY_PASS(k)                                                                   \
    if ((k) * G < T)                                                                          \
        tile_legacy_pass(type, block_bytes, w, row_stride, x + (k) * G * ldx, ldx, xs + (k) * G, \
                         T, n, y + (k) * G * ldy, ldy, R, T - (k) * G < G ? T - (k) * G : G);
    DS4N_LEGACY_PASS(0) DS4N_LEGACY_PASS(1) DS4N_LEGACY_PASS(2) DS4N_LEGACY_PASS(3)
#undef DS4N_LEGACY_PASS
}
_Static_assert(DS4N_TILE_ACC / DS4N_MV_ROWS * 4 >= DS4N_SMALL_T, "tile_legacy: 4 passes cover a tile");

/* ---- Q4_K / Q5_K: eight sub-blocks of 32, y = d·sc·q - dmin·m ---------------------------- */

DS4N_INLINE void dequant_k_sub32(uint16_t d16, uint16_t dmin16, const uint8_t *scales,
                                 const uint8_t *qs, const uint8_t *qh, float *y) {
    float d = f16(d16), dmin = f16(dmin16);
    v16 q[2];
    for (int s = 0; s < 8; s++, y += 32) {
        uint8_t sc, m;
        ds4n_k_scale_min(scales, s, &sc, &m);
        k45_codes(qs, qh, s, q);
        v16_store_affine(y, q[0], d * (float)sc, -(dmin * (float)m));
        v16_store_affine(y + 16, q[1], d * (float)sc, -(dmin * (float)m));
    }
}

DS4N_DEFINE_Q45_K_DEQUANT(dequant_k_sub32)

DS4N_INLINE float dot_q45_K(const void *w, const float *x, int64_t n, int five) {
    const uint8_t *p = w;
    vacc acc = vzero(), accm = vzero();
    v16 q[2];
    for (int64_t i = 0; i < n / QK_K; i++) {
        const block_q4_K *b4 = (const block_q4_K *)p;
        const block_q5_K *b5 = (const block_q5_K *)p;
        const uint8_t *qs = five ? b5->qs : b4->qs, *qh = five ? b5->qh : NULL;
        float d = f16(b4->d), dmin = f16(b4->dmin); /* same offsets in both layouts */
        p += five ? sizeof(block_q5_K) : sizeof(block_q4_K);
        for (int s = 0; s < 8; s++, x += 32) {
            uint8_t sc, m;
            ds4n_k_scale_min(b4->scales, s, &sc, &m);
            k45_codes(qs, qh, s, q);
            acc = vfma_s(acc, d * (float)sc, vadd(v16_dot(q[0], x), v16_dot(q[1], x + 16)));
            accm = vfma_s(accm, dmin * (float)m, vadd(v16_sum(x), v16_sum(x + 16)));
        }
    }
    return vhsum(vsub(acc, accm));
}

#ifndef DS4N_OWN_K45_MATVEC
DS4N_INLINE void rows_q45_K(int five, const void *w, int64_t row_stride, const float *x,
                            const float *xsum, int64_t n, float *y, const int R) {
    const int64_t bb = five ? sizeof(block_q5_K) : sizeof(block_q4_K);
    vacc acc[DS4N_MV_ROWS];
    float accm[DS4N_MV_ROWS], d[DS4N_MV_ROWS], dmin[DS4N_MV_ROWS];
    for (int r = 0; r < R; r++) acc[r] = vzero(), accm[r] = 0.0f;
    v16 q[2];
    const uint8_t *p = w;
    for (int64_t i = 0; i < n / QK_K; i++, p += bb) {
        for (int r = 0; r < R; r++) {
            const block_q4_K *b4 = (const block_q4_K *)(p + r * row_stride);
            d[r] = f16(b4->d), dmin[r] = f16(b4->dmin); /* same offsets in both layouts */
        }
        for (int s = 0; s < 8; s++, x += 32, xsum++) {
            for (int r = 0; r < R; r++) {
                const block_q4_K *b4 = (const block_q4_K *)(p + r * row_stride);
                const block_q5_K *b5 = (const block_q5_K *)(p + r * row_stride);
                uint8_t sc, m;
                ds4n_k_scale_min(b4->scales, s, &sc, &m);
                k45_codes(five ? b5->qs : b4->qs, five ? b5->qh : NULL, s, q);
                acc[r] = vfma_s(acc[r], d[r] * (float)sc, block32_dot(q, x));
                accm[r] += dmin[r] * (float)m * xsum[0];
            }
        }
    }
    for (int r = 0; r < R; r++) y[r] = vhsum(acc[r]) - accm[r];
}

/* rows_q45_K's arithmetic for one row and T tokens. */
DS4N_INLINE void cols_q45_K(int five, const void *w, const float *x, int64_t ldx,
                            const float *xsum, int64_t n, float *y, int64_t ldy, const int T) {
    const int64_t bb = five ? sizeof(block_q5_K) : sizeof(block_q4_K), nb = n / QK;
    vacc acc[DS4N_SMALL_T];
    float accm[DS4N_SMALL_T];
    for (int t = 0; t < T; t++) acc[t] = vzero(), accm[t] = 0.0f;
    v16 q[2];
    const uint8_t *p = w;
    for (int64_t i = 0; i < n / QK_K; i++, p += bb) {
        const block_q4_K *b4 = (const block_q4_K *)p;
        const block_q5_K *b5 = (const block_q5_K *)p;
        const float d = f16(b4->d), dmin = f16(b4->dmin); /* same offsets in both layouts */
        for (int s = 0; s < 8; s++) {
            const int64_t j = i * 8 + s; /* the 32-group */
            uint8_t sc, m;
            ds4n_k_scale_min(b4->scales, s, &sc, &m);
            k45_codes(five ? b5->qs : b4->qs, five ? b5->qh : NULL, s, q);
            for (int t = 0; t < T; t++) {
                acc[t] = vfma_s(acc[t], d * (float)sc, block32_dot(q, x + t * ldx + j * QK));
                accm[t] += dmin * (float)m * xsum[t * nb + j];
            }
        }
    }
    for (int t = 0; t < T; t++) y[t * ldy] = vhsum(acc[t]) - accm[t];
}

#endif

static float dot_q4_K(const void *w, const float *x, int64_t n) { return dot_q45_K(w, x, n, 0); }
static float dot_q5_K(const void *w, const float *x, int64_t n) { return dot_q45_K(w, x, n, 1); }

/* ---- Q6_K: sixteen groups of 16 with signed 8-bit scales --------------------------------- */

static void dequant_q6_K(const void *src, float *y, int64_t n) {
    const block_q6_K *b = src;
    v16 q[2];
    for (int64_t i = 0; i < n / QK_K; i++) {
        float d = f16(b[i].d);
        for (int g = 0; g < 8; g++, y += 32) { /* g: 32-group r = g%4 of half g/4 */
            q6_codes(&b[i], g / 4, g % 4, q);
            v16_store(y, q[0], d * (float)b[i].scales[2 * g]);
            v16_store(y + 16, q[1], d * (float)b[i].scales[2 * g + 1]);
        }
    }
}

static float dot_q6_K(const void *w, const float *x, int64_t n) {
    const block_q6_K *b = w;
    vacc acc = vzero();
    v16 q[2];
    for (int64_t i = 0; i < n / QK_K; i++) {
        float d = f16(b[i].d);
        for (int g = 0; g < 8; g++, x += 32) {
            q6_codes(&b[i], g / 4, g % 4, q);
            acc = vfma_s(acc, d * (float)b[i].scales[2 * g], v16_dot(q[0], x));
            acc = vfma_s(acc, d * (float)b[i].scales[2 * g + 1], v16_dot(q[1], x + 16));
        }
    }
    return vhsum(acc);
}

#ifndef DS4N_OWN_Q6_K_MATVEC
DS4N_INLINE void rows_q6_K(const void *w, int64_t row_stride, const float *x, const float *xsum,
                           int64_t n, float *y, const int R) {
    vacc acc[DS4N_MV_ROWS];
    float d[DS4N_MV_ROWS];
    for (int r = 0; r < R; r++) acc[r] = vzero();
    v16 q[2];
    const uint8_t *p = w;
    for (int64_t i = 0; i < n / QK_K; i++, p += sizeof(block_q6_K)) {
        for (int r = 0; r < R; r++) d[r] = f16(((const block_q6_K *)(p + r * row_stride))->d);
        for (int g = 0; g < 8; g++, x += 32) {
            for (int r = 0; r < R; r++) {
                const block_q6_K *b = (const block_q6_K *)(p + r * row_stride);
                q6_codes(b, g / 4, g % 4, q);
                acc[r] = vfma_s(acc[r], d[r] * (float)b->scales[2 * g], v16_dot(q[0], x));
                acc[r] = vfma_s(acc[r], d[r] * (float)b->scales[2 * g + 1], v16_dot(q[1], x + 16));
            }
        }
    }
    for (int r = 0; r < R; r++) y[r] = vhsum(acc[r]);
}

/* rows_q6_K's arithmetic for one row and T tokens. */
DS4N_INLINE void cols_q6_K(const void *w, const float *x, int64_t ldx, const float *xsum,
                           int64_t n, float *y, int64_t ldy, const int T) {
    vacc acc[DS4N_SMALL_T];
    for (int t = 0; t < T; t++) acc[t] = vzero();
    v16 q[2];
    const block_q6_K *b = w;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = f16(b[i].d);
        for (int g = 0; g < 8; g++) {
            const float *xg = x + (i * 8 + g) * 32;
            q6_codes(&b[i], g / 4, g % 4, q);
            for (int t = 0; t < T; t++) {
                acc[t] = vfma_s(acc[t], d * (float)b[i].scales[2 * g], v16_dot(q[0], xg + t * ldx));
                acc[t] = vfma_s(acc[t], d * (float)b[i].scales[2 * g + 1],
                                v16_dot(q[1], xg + t * ldx + 16));
            }
        }
    }
    for (int t = 0; t < T; t++) y[t * ldy] = vhsum(acc[t]);
}

#endif

/* ---- Q2_K / Q3_K: sixteen groups of 16 ---------------------------------------------------- */

/* Scale (and Q2_K's min) of 16-group g, computed as the scalar dequantizers do. */
DS4N_INLINE void k23_scales(int type, const void *blk, int g, float *dl, float *ml) {
    if (type == DS4N_Q2_K) {
        const block_q2_K *b = blk;
        *dl = f16(b->d) * (float)(b->scales[g] & 0x0f);
        *ml = f16(b->dmin) * (float)(b->scales[g] >> 4);
    } else {
        const block_q3_K *b = blk;
        *dl = f16(b->d) * (float)ds4n_q3_K_scale(b->scales, g);
        *ml = 0.0f;
    }
}

/* The 32 codes of 16-groups g and g+1 (g even). */
DS4N_INLINE void k23_group_codes(int type, const void *blk, int g, v16 q[2]) {
    const block_q2_K *b2 = blk;
    const block_q3_K *b3 = blk;
    if (type == DS4N_Q2_K) k23_codes(b2->qs, NULL, g / 8, (g % 8) / 2, q);
    else k23_codes(b3->qs, b3->hmask, g / 8, (g % 8) / 2, q);
}

DS4N_INLINE void dequant_k23(int type, int64_t block_bytes, const void *src, float *y, int64_t n) {
    const uint8_t *p = src;
    v16 q[2];
    for (int64_t i = 0; i < n / QK_K; i++, p += block_bytes)
        for (int g = 0; g < 16; g += 2) {
            k23_group_codes(type, p, g, q);
            for (int h = 0; h < 2; h++, y += 16) {
                float dl, ml;
                k23_scales(type, p, g + h, &dl, &ml);
                if (type == DS4N_Q2_K) v16_store_affine(y, q[h], dl, -ml);
                else v16_store(y, q[h], dl);
            }
        }
}

DS4N_INLINE float dot_k23(int type, int64_t block_bytes, const void *w, const float *x, int64_t n) {
    const uint8_t *p = w;
    vacc acc = vzero(), accm = vzero();
    v16 q[2];
    for (int64_t i = 0; i < n / QK_K; i++, p += block_bytes)
        for (int g = 0; g < 16; g += 2) {
            k23_group_codes(type, p, g, q);
            for (int h = 0; h < 2; h++, x += 16) {
                float dl, ml;
                k23_scales(type, p, g + h, &dl, &ml);
                acc = vfma_s(acc, dl, v16_dot(q[h], x));
                if (type == DS4N_Q2_K) accm = vfma_s(accm, ml, v16_sum(x));
            }
        }
    return vhsum(vsub(acc, accm));
}

/* ---- IQ2_XXS: eight groups of 32, four signed lattice points each ----------------------- */

/* Group g: the 4 lattice indices and the signs + 4-bit scale word; returns the scale. */
DS4N_INLINE float iq2_group(const block_iq2_xxs *b, int g, uint32_t *idx, uint32_t *meta) {
    memcpy(idx, &b->qs[4 * g], 4);
    memcpy(meta, &b->qs[4 * g + 2], 4);
    return f16(b->d) * (0.5f + (float)(*meta >> 28)) * 0.25f;
}

static void dequant_iq2_xxs(const void *src, float *y, int64_t n) {
    const block_iq2_xxs *b = src;
    v16 q[2];
    for (int64_t i = 0; i < n / QK_K; i++)
        for (int g = 0; g < 8; g++, y += 32) {
            uint32_t idx, meta;
            float db = iq2_group(&b[i], g, &idx, &meta);
            iq2_codes(idx, meta, q);
            v16_store(y, q[0], db);
            v16_store(y + 16, q[1], db);
        }
}

static float dot_iq2_xxs(const void *w, const float *x, int64_t n) {
    const block_iq2_xxs *b = w;
    vacc acc = vzero();
    v16 q[2];
    for (int64_t i = 0; i < n / QK_K; i++)
        for (int g = 0; g < 8; g++, x += 32) {
            uint32_t idx, meta;
            float db = iq2_group(&b[i], g, &idx, &meta);
            iq2_codes(idx, meta, q);
            acc = vfma_s(acc, db, vadd(v16_dot(q[0], x), v16_dot(q[1], x + 16)));
        }
    return vhsum(acc);
}

/* ---- IQ4_XS: eight sub-blocks of 32 with signed 6-bit scales, IQ4_NL's levels -------- */

static void dequant_iq4_xs(const void *src, float *y, int64_t n) {
    const block_iq4_xs *b = src;
    v16 q[2];
    for (int64_t i = 0; i < n / QK_K; i++) {
        float d = f16(b[i].d);
        for (int ib = 0; ib < 8; ib++, y += 32) {
            float dl = d * (float)ds4n_iq4_xs_scale(&b[i], ib);
            nibble_codes(b[i].qs + 16 * ib, ds4n_iq4nl_values, q);
            v16_store(y, q[0], dl);
            v16_store(y + 16, q[1], dl);
        }
    }
}

static float dot_iq4_xs(const void *w, const float *x, int64_t n) {
    const block_iq4_xs *b = w;
    vacc acc = vzero();
    v16 q[2];
    for (int64_t i = 0; i < n / QK_K; i++) {
        float d = f16(b[i].d);
        for (int ib = 0; ib < 8; ib++, x += 32) {
            nibble_codes(b[i].qs + 16 * ib, ds4n_iq4nl_values, q);
            float dl = d * (float)ds4n_iq4_xs_scale(&b[i], ib);
            acc = vfma_s(acc, dl, vadd(v16_dot(q[0], x), v16_dot(q[1], x + 16)));
        }
    }
    return vhsum(acc);
}

/* ---- the kernel set ------------------------------------------------------------------- */

/* rows_<name>(w, row_stride, x, xsum, n, y, R) over body(args..., R) with R a constant, so the
 * R accumulators stay in registers. */
#define DS4N_ROWS_KERNEL(name, body, ...)                                                   \
    static void rows_##name(const void *w, int64_t rb, const float *x, const float *xs,    \
                            int64_t n, float *y, int R) {                                   \
        switch (R) {                                                                        \
        case 1: body(__VA_ARGS__, w, rb, x, xs, n, y, 1); break;                            \
        case 2: body(__VA_ARGS__, w, rb, x, xs, n, y, 2); break;                            \
        case 3: body(__VA_ARGS__, w, rb, x, xs, n, y, 3); break;                            \
        default: body(__VA_ARGS__, w, rb, x, xs, n, y, 4); break;                           \
        }                                                                                   \
    }
_Static_assert(DS4N_MV_ROWS == 4, "DS4N_ROWS_KERNEL covers 1..4 rows");
/* cols_<name>(w, row_stride, x, ldx, xsum, n, y, ldy, R, T) over a one-row body(args...,
 * w, x, ldx, xsum, n, y, ldy, T) with T a constant, row by row. */
#define DS4N_COLS_CASE(T_, body, ...) \
    case T_: body(__VA_ARGS__, wr, x, ldx, xs, n, y + r, ldy, T_); break;
#define DS4N_COLS_KERNEL(name, body, ...)                                                   \
    static void cols_##name(const void *w, int64_t rs, const float *x, int64_t ldx,        \
                            const float *xs, int64_t n, float *y, int64_t ldy, int R, int T) { \
        for (int r = 0; r < R; r++) {                                                       \
            const void *wr = (const uint8_t *)w + r * rs;                                   \
            switch (T) {                                                                    \
                DS4N_COLS_CASE(1, body, __VA_ARGS__) DS4N_COLS_CASE(2, body, __VA_ARGS__)   \
                DS4N_COLS_CASE(3, body, __VA_ARGS__) DS4N_COLS_CASE(4, body, __VA_ARGS__)   \
                DS4N_COLS_CASE(5, body, __VA_ARGS__) DS4N_COLS_CASE(6, body, __VA_ARGS__)   \
                DS4N_COLS_CASE(7, body, __VA_ARGS__)                                        \
            default: body(__VA_ARGS__, wr, x, ldx, xs, n, y + r, ldy, 8); break;            \
            }                                                                               \
        }                                                                                   \
    }
/* cols_<name> over a tile body(args..., w, row_stride, x, ldx, xsum, n, y, ldy, R, T) with R
 * and T constants (32 instances: the accumulators stay in registers). */
#define DS4N_COLS_TILE_CASE(R_, T_, body, ...) \
    case R_ * 16 + T_: body(__VA_ARGS__, w, rs, x, ldx, xs, n, y, ldy, R_, T_); break;
#define DS4N_COLS_TILE_CASES(R_, body, ...)                                                     \
    DS4N_COLS_TILE_CASE(R_, 1, body, __VA_ARGS__) DS4N_COLS_TILE_CASE(R_, 2, body, __VA_ARGS__)      \
    DS4N_COLS_TILE_CASE(R_, 3, body, __VA_ARGS__) DS4N_COLS_TILE_CASE(R_, 4, body, __VA_ARGS__)      \
    DS4N_COLS_TILE_CASE(R_, 5, body, __VA_ARGS__) DS4N_COLS_TILE_CASE(R_, 6, body, __VA_ARGS__)      \
    DS4N_COLS_TILE_CASE(R_, 7, body, __VA_ARGS__) DS4N_COLS_TILE_CASE(R_, 8, body, __VA_ARGS__)
#define DS4N_TILE_KERNEL(name, body, ...)                                                   \
    static void cols_##name(const void *w, int64_t rs, const float *x, int64_t ldx,        \
                            const float *xs, int64_t n, float *y, int64_t ldy, int R, int T) { \
        switch (R * 16 + T) {                                                               \
            DS4N_COLS_TILE_CASES(1, body, __VA_ARGS__) DS4N_COLS_TILE_CASES(2, body, __VA_ARGS__)     \
            DS4N_COLS_TILE_CASES(3, body, __VA_ARGS__) DS4N_COLS_TILE_CASES(4, body, __VA_ARGS__)     \
        default: break; /* R, T out of range: the caller's contract says never */          \
        }                                                                                   \
    }
_Static_assert(DS4N_SMALL_T == 8 && DS4N_MV_ROWS == 4,
               "DS4N_COLS_KERNEL covers 1..8 tokens, DS4N_TILE_KERNEL 1..4 rows of them");
#define DS4N_LEGACY_ROWS(name, T, block)                    \
    DS4N_ROWS_KERNEL(name, rows_legacy, T, sizeof(block))   \
    DS4N_TILE_KERNEL(name, tile_legacy, T, sizeof(block))
#ifndef DS4N_OWN_LEGACY_MATVEC /* a set may define its own for the f16-scaled types */
DS4N_LEGACY_ROWS(q4_0, DS4N_Q4_0, block_q4_0)
DS4N_LEGACY_ROWS(q4_1, DS4N_Q4_1, block_q4_1)
DS4N_LEGACY_ROWS(q5_0, DS4N_Q5_0, block_q5_0)
DS4N_LEGACY_ROWS(q5_1, DS4N_Q5_1, block_q5_1)
DS4N_LEGACY_ROWS(q8_0, DS4N_Q8_0, block_q8_0)
#endif
DS4N_LEGACY_ROWS(iq4_nl, DS4N_IQ4_NL, block_iq4_nl)
DS4N_LEGACY_ROWS(mxfp4, DS4N_MXFP4, block_mxfp4)
#ifndef DS4N_OWN_K45_MATVEC /* a set may define its own rows_/cols_q4_K and q5_K */
DS4N_ROWS_KERNEL(q4_K, rows_q45_K, 0)
DS4N_ROWS_KERNEL(q5_K, rows_q45_K, 1)
DS4N_COLS_KERNEL(q4_K, cols_q45_K, 0)
DS4N_COLS_KERNEL(q5_K, cols_q45_K, 1)
#endif
#ifndef DS4N_OWN_Q6_K_MATVEC /* a set may define its own rows_q6_K_R and cols_q6_K_T */
#define rows_q6_K_body(unused, ...) rows_q6_K(__VA_ARGS__)
DS4N_ROWS_KERNEL(q6_K_R, rows_q6_K_body, 0)
#define cols_q6_K_body(unused, ...) cols_q6_K(__VA_ARGS__)
DS4N_COLS_KERNEL(q6_K_T, cols_q6_K_body, 0)
#endif

#define DS4N_GENERIC_KERNELS(name, T, block, kind)                             \
    static void dequant_##name(const void *s, float *y, int64_t n) {          \
        dequant_##kind(T, sizeof(block), s, y, n);                             \
    }                                                                          \
    static float dot_##name(const void *w, const float *x, int64_t n) {       \
        return dot_##kind(T, sizeof(block), w, x, n);                          \
    }
DS4N_GENERIC_KERNELS(q4_0, DS4N_Q4_0, block_q4_0, legacy)
DS4N_GENERIC_KERNELS(q4_1, DS4N_Q4_1, block_q4_1, legacy)
DS4N_GENERIC_KERNELS(q5_0, DS4N_Q5_0, block_q5_0, legacy)
DS4N_GENERIC_KERNELS(q5_1, DS4N_Q5_1, block_q5_1, legacy)
DS4N_GENERIC_KERNELS(q8_0, DS4N_Q8_0, block_q8_0, legacy)
DS4N_GENERIC_KERNELS(iq4_nl, DS4N_IQ4_NL, block_iq4_nl, legacy)
DS4N_GENERIC_KERNELS(mxfp4, DS4N_MXFP4, block_mxfp4, legacy)
DS4N_GENERIC_KERNELS(q2_K, DS4N_Q2_K, block_q2_K, k23)
DS4N_GENERIC_KERNELS(q3_K, DS4N_Q3_K, block_q3_K, k23)

#define DS4N_FLOAT_KERNELS(name, T)                                            \
    static void dequant_##name(const void *s, float *y, int64_t n) {          \
        dequant_float(T, s, y, n);                                             \
    }                                                                          \
    static float dot_##name(const void *w, const float *x, int64_t n) {       \
        return dot_float(T, w, x, n);                                          \
    }
DS4N_FLOAT_KERNELS(f32, DS4N_F32)
DS4N_FLOAT_KERNELS(f16, DS4N_F16)
DS4N_FLOAT_KERNELS(bf16, DS4N_BF16)

/* Defines the kernel set `set_name` with the GEMM micro-kernel `tile_fn` of tile_cols tokens
 * (0: DS4N_TILE_COLS). */
#define DS4N_ROW(T, name) [DS4N_##T] = {dequant_##name, dot_##name, NULL, NULL, NULL}
#define DS4N_ROW_MV(T, name) [DS4N_##T] = {dequant_##name, dot_##name, rows_##name, cols_##name, NULL}
#define DS4N_DEFINE_KERNEL_SET(set_name, tile_fn, cols, hw)                              \
    const struct ds4n_kernel_set set_name = {                                            \
        .row = {                                                                         \
            DS4N_ROW(F32, f32), DS4N_ROW(F16, f16), DS4N_ROW(BF16, bf16),                \
            DS4N_ROW_MV(Q4_0, q4_0), DS4N_ROW_MV(Q4_1, q4_1), DS4N_ROW_MV(Q5_0, q5_0),   \
            DS4N_ROW_MV(Q5_1, q5_1), DS4N_ROW_MV(Q8_0, q8_0),                            \
            DS4N_ROW(Q2_K, q2_K), DS4N_ROW(Q3_K, q3_K), DS4N_ROW_MV(Q4_K, q4_K),         \
            DS4N_ROW_MV(Q5_K, q5_K),                                                     \
            [DS4N_Q6_K] = {dequant_q6_K, dot_q6_K, rows_q6_K_R, cols_q6_K_T, NULL},      \
            DS4N_ROW(IQ2_XXS, iq2_xxs), DS4N_ROW_MV(IQ4_NL, iq4_nl),                     \
            DS4N_ROW(IQ4_XS, iq4_xs), DS4N_ROW_MV(MXFP4, mxfp4),                         \
        },                                                                               \
        .tile = tile_fn, .tile_cols = cols, .hw_prefetch = hw,                           \
    };

#endif
