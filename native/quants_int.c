/* The integer-activation path: activation splitting, the scalar (reference) kernels, and the
 * choice of kernels per SIMD level. The arithmetic is defined in quants_int.h. */
#include "quants_int.h"

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#elif defined(__aarch64__) && defined(__APPLE__)
#include <sys/sysctl.h>
#endif

static ds4n_xq_quantize_fn active_quantize;

static int64_t align64(int64_t n) { return (n + 63) & ~(int64_t)63; }

size_t ds4n_xq_bytes(int limbs, int sb, int64_t K, int64_t T) {
    const int64_t nb = K / QK;
    if (sb) /* a, xs per group, asum, the byte planes */
        return (size_t)(align64(T * (limbs - 1) * (K + DS4N_SB_PAD) * 2) + align64(T * (nb / 8) * 4) +
                        align64(T * (limbs - 1) * nb * 4) +
                        /* the planes of up to DS4N_SMALL_T tokens: a chunk's buffer also
                         * serves a last, short chunk, which has them */
                        align64((T < DS4N_SMALL_T ? T : DS4N_SMALL_T) * (limbs - 1) *
                                (K + DS4N_SB_PAD) * 4));
    return (size_t)(align64(T * limbs * K) + 2 * align64(T * nb * 4));
}

void ds4n_xq_init(struct ds4n_xq *xq, void *buf, int limbs, int sb, int64_t K, int64_t T) {
    const int64_t nb = K / QK;
    uint8_t *p = buf;
    memset(xq, 0, sizeof *xq);
    xq->limbs = limbs, xq->sb = sb, xq->K = K, xq->nb = nb, xq->T = T;
    if (sb) {
        xq->a = (int16_t *)p;
        xq->lda = K + DS4N_SB_PAD;
        p += align64(T * (limbs - 1) * xq->lda * 2);
        xq->xs = (float *)p;
        p += align64(T * (nb / 8) * 4);
        xq->asum = (int32_t *)p;
        p += align64(T * (limbs - 1) * nb * 4);
        /* the byte planes serve the one-token kernels, and cost prefill's chunks a pass */
        xq->ab = T <= DS4N_SMALL_T ? p : NULL;
        return;
    }
    xq->q = (int8_t *)p;
    p += align64(T * limbs * K);
    xq->xs = (float *)p;
    p += align64(T * nb * 4);
    xq->bsum = (float *)p;
}

size_t ds4n_sb_panel_bytes(int64_t rows, int64_t ng) {
    return (size_t)(align64(rows * ng * DS4N_INT_GROUP * 2) + 2 * align64(rows * ng * 4) +
                    align64(rows * ng * 8 * 4));
}

void ds4n_sb_panel_init(struct ds4n_sb_panel *p, void *buf, int64_t rows, int64_t ng) {
    uint8_t *b = buf;
    p->ng = ng;
    p->w = (int16_t *)b;
    b += align64(rows * ng * DS4N_INT_GROUP * 2);
    p->d = (float *)b;
    b += align64(rows * ng * 4);
    p->dmin = (float *)b;
    b += align64(rows * ng * 4);
    p->m = (int32_t *)b;
}

static DS4N_INT_DEFINE_QUANTIZE(xq_quantize_scalar, ds4n_int_quantize_block, ds4n_sb_quantize_group,
                                ds4n_sb_split_group)

void ds4n_xq_quantize(struct ds4n_xq *xq, const float *X, int64_t t0, int64_t t1) {
    active_quantize(xq, X, t0, t1);
}

/* ---- scalar kernels ------------------------------------------------------------------------ */

static void int_row_ref(int type, const void *w, const struct ds4n_xq *xq, int64_t t0, int T,
                        float *y, int64_t ldy) {
    struct ds4n_int_group g = {0};
    float acc[DS4N_SMALL_T][16] = {{0}}, accm[DS4N_SMALL_T][8] = {{0}};
    for (int64_t b0 = 0; b0 < xq->nb; b0 += 8) {
        const int n = xq->nb - b0 < 8 ? (int)(xq->nb - b0) : 8;
        ds4n_int_unpack(type, w, b0, n, &g);
        for (int t = 0; t < T; t++) ds4n_int_group_ref(&g, xq, t0 + t, b0, acc[t], accm[t]);
    }
    for (int t = 0; t < T; t++) y[t * ldy] = ds4n_int_finish(acc[t], accm[t]);
}

/* The super-block format's reference (Q4_K, Q6_K): ds4n_sb_part_fn. */
static void sb_part_ref(int type, const void *w, const struct ds4n_xq *xq, int64_t g0,
                        int64_t g1, int64_t t0, int T, float *acc, float *y, int64_t ldy) {
    struct ds4n_sb_weights u;
    const int64_t bb = type == DS4N_Q4_K ? sizeof(block_q4_K) : sizeof(block_q6_K);
    if (g0 == 0) memset(acc, 0, sizeof(float) * 16 * (size_t)T);
    for (int64_t g = g0; g < g1; g++) {
        ds4n_sb_unpack(type, (const uint8_t *)w + g * bb, &u);
        for (int t = 0; t < T; t++) ds4n_sb_group_ref(type, &u, xq, t0 + t, g, acc + 16 * t);
    }
    if (y)
        for (int t = 0; t < T; t++) y[t * ldy] = ds4n_sb_finish(acc + 16 * t);
}

static void sb_row_ref(int type, const void *w, const struct ds4n_xq *xq, int64_t t0, int T,
                       float *y, int64_t ldy) {
    float acc[DS4N_SMALL_T * 16];
    sb_part_ref(type, w, xq, 0, xq->nb / 8, t0, T, acc, y, ldy);
}

static void part_ref_q4_K(const void *w, const struct ds4n_xq *xq, int64_t g0, int64_t g1,
                          int64_t t0, int T, float *acc, float *y, int64_t ldy) {
    sb_part_ref(DS4N_Q4_K, w, xq, g0, g1, t0, T, acc, y, ldy);
}
static void part_ref_q6_K(const void *w, const struct ds4n_xq *xq, int64_t g0, int64_t g1,
                          int64_t t0, int T, float *acc, float *y, int64_t ldy) {
    sb_part_ref(DS4N_Q6_K, w, xq, g0, g1, t0, T, acc, y, ldy);
}

#define DS4N_INT_REF(name, T_)                                                                  \
    static void int_ref_##name(const void *w, const struct ds4n_xq *xq, int64_t t0, int T,    \
                               float *y, int64_t ldy) {                                         \
        int_row_ref(T_, w, xq, t0, T, y, ldy);                                                  \
    }
DS4N_INT_REF(q8_0, DS4N_Q8_0)
DS4N_INT_REF(q4_0, DS4N_Q4_0)
DS4N_INT_REF(q4_1, DS4N_Q4_1)
static void int_ref_q4_K(const void *w, const struct ds4n_xq *xq, int64_t t0, int T, float *y,
                         int64_t ldy) {
    sb_row_ref(DS4N_Q4_K, w, xq, t0, T, y, ldy);
}
static void int_ref_q6_K(const void *w, const struct ds4n_xq *xq, int64_t t0, int T, float *y,
                         int64_t ldy) {
    sb_row_ref(DS4N_Q6_K, w, xq, t0, T, y, ldy);
}

static const ds4n_int_fn int_scalar[DS4N_TYPE_SLOTS] = {
    [DS4N_Q8_0] = int_ref_q8_0,
    [DS4N_Q4_0] = int_ref_q4_0,
    [DS4N_Q4_1] = int_ref_q4_1,
    [DS4N_Q4_K] = int_ref_q4_K,
    [DS4N_Q6_K] = int_ref_q6_K,
};

/* ---- selection ----------------------------------------------------------------------------- */

static ds4n_int_fn active_int[DS4N_TYPE_SLOTS];
static ds4n_int_rows_fn active_int_rows[DS4N_TYPE_SLOTS];
static ds4n_sb_part_fn active_sb_part[2]; /* Q4_K, Q6_K */
static ds4n_sb_tile_fn active_sb_tile;
static ds4n_sb_unpack_fn active_sb_unpack;
static const struct ds4n_int_set *active_set;

static const char *active_set_name = "scalar";

#if defined(__x86_64__) || defined(_M_X64)
static int cpu_has_vnni(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni");
}
#endif

#if defined(__aarch64__)
#if defined(__linux__)
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20) /* the Linux arm64 ABI's bit for SDOT/UDOT */
#endif
static int cpu_has_dotprod(void) { return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0; }
#elif defined(__APPLE__)
static int cpu_has_dotprod(void) {
    int v = 0;
    size_t n = sizeof v;
    return sysctlbyname("hw.optional.arm.FEAT_DotProd", &v, &n, NULL, 0) == 0 && v;
}
#else
static int cpu_has_dotprod(void) { return 0; } /* unknown OS: the baseline kernels */
#endif
#endif

/* Slot by slot, the first of over, own and the scalar one that has a kernel. */
#define PICK(over, own, field, scalar)                                                         \
    ((over) && (over)->field ? (over)->field : (own) && (own)->field ? (own)->field : (scalar))

void ds4n_int_select(int level) {
    const struct ds4n_int_set *own = NULL, *over = NULL;
    const char *name = "scalar";
    ds4n_xq_quantize_fn quantize = NULL;
#if defined(__x86_64__) || defined(_M_X64)
    /* AVX-512 without VNNI runs the AVX2 kernels (bitwise the same as every level's), with
     * the AVX-512 quantizer (the limbs are the same from every quantizer). */
    if (level == DS4N_SIMD_AVX512 || level == DS4N_SIMD_AMX) {
        const int vnni = cpu_has_vnni();
        own = vnni ? &ds4n_int_avx512 : &ds4n_int_avx2;
        quantize = ds4n_int_avx512.quantize;
        name = vnni ? "avx512-vnni" : "avx2 (avx512 quantizer)";
    }
    if (level == DS4N_SIMD_AVX2) own = &ds4n_int_avx2, name = "avx2";
#endif
#if defined(__aarch64__)
    /* The SDOT build replaces the block-format kernels where the CPU has SDOT; every other
     * slot is the baseline NEON set's. */
    if (level == DS4N_SIMD_NEON) {
        own = &ds4n_int_neon, name = "neon";
        if (cpu_has_dotprod()) over = &ds4n_int_neon_dotprod, name = "neon+dotprod";
    }
#endif
    active_set_name = name;
    active_set = own; /* the set ds4n_mac_peak probes the instruction of */
    /* Slots a level leaves NULL, and levels without kernels of their own, run the scalar
     * ones: slower, bitwise the same. */
    active_quantize = quantize ? quantize : PICK(over, own, quantize, xq_quantize_scalar);
    for (int t = 0; t < DS4N_TYPE_SLOTS; t++) {
        active_int[t] = PICK(over, own, row[t], int_scalar[t]);
        /* The scalar level: decode row by row (the row kernel above). */
        active_int_rows[t] = PICK(over, own, rows[t], NULL);
    }
    /* Prefill on the part kernels where the level has no tile (a scalar tile would only
     * repeat their arithmetic, slowly); the tile kernels are tested bitwise against them. */
    active_sb_part[0] = PICK(over, own, part[0], part_ref_q4_K);
    active_sb_part[1] = PICK(over, own, part[1], part_ref_q6_K);
    /* the tile and its unpacker from one set (the panel layout is the tile's) */
    const struct ds4n_int_set *tiles = over && over->tile ? over : own;
    active_sb_tile = tiles ? tiles->tile : NULL;
    active_sb_unpack = tiles ? tiles->unpack : NULL;
}
#undef PICK

const char *ds4n_int_kernel_set(void) { return active_set_name; }

ds4n_sb_tile_fn ds4n_active_sb_tile(void) { return active_sb_tile; }
const struct ds4n_int_set *ds4n_active_int_set(void) { return active_set; }
ds4n_sb_unpack_fn ds4n_active_sb_unpack(void) { return active_sb_unpack; }

ds4n_sb_part_fn ds4n_active_sb_part(int type) { return active_sb_part[type == DS4N_Q6_K]; }

ds4n_int_rows_fn ds4n_active_int_rows(int type) {
    return type >= 0 && type < DS4N_TYPE_SLOTS ? active_int_rows[type] : NULL;
}

ds4n_int_fn ds4n_active_int_kernel(int type) {
    return type >= 0 && type < DS4N_TYPE_SLOTS ? active_int[type] : NULL;
}

int ds4n_int_type_supported(int type) {
    return type >= 0 && type < DS4N_TYPE_SLOTS && int_scalar[type] != NULL;
}
