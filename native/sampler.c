/* Next-token sampling on the native side (the semantics of ds4d/engine/sampler.py): a pass
 * per filter over the vocabulary, no sort of it (only of a top_p nucleus, and that in linear
 * time), and no allocation per token (scratch is per thread and grows to the largest
 * vocabulary seen). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ds4n.h"

static _Thread_local int32_t *pos_buf; /* candidate positions into values */
static _Thread_local float *w_buf;     /* their weights */
/* the radix sort's other half: positions and keys of one pass, keys of the next */
static _Thread_local int32_t *pos_tmp;
static _Thread_local uint32_t *key_buf, *key_tmp;
static _Thread_local float *draw_buf; /* the final candidates' weights, in their order */
static _Thread_local int64_t cap;

static int grow_one(void **buf, size_t item, int64_t n) {
    void *p = realloc(*buf, item * (size_t)n);
    if (!p) return -1;
    *buf = p;
    return 0;
}

static int grow(int64_t n) {
    if (n <= cap) return 0;
    if (grow_one((void **)&pos_buf, sizeof *pos_buf, n) ||
        grow_one((void **)&w_buf, sizeof *w_buf, n) ||
        grow_one((void **)&pos_tmp, sizeof *pos_tmp, n) ||
        grow_one((void **)&key_buf, sizeof *key_buf, n) ||
        grow_one((void **)&key_tmp, sizeof *key_tmp, n) ||
        grow_one((void **)&draw_buf, sizeof *draw_buf, n))
        return -1;
    cap = n;
    return 0;
}

/* e^x for x <= 0, within a few ulp of expf, 0 below e^-86 (under 1e-37: nothing next to the
 * best token's weight of 1). Branch-free, so the compiler vectorises the per-token pass over
 * a whole vocabulary (this file is built with -fno-trapping-math, so the selects vectorise). */
static inline float exp_nonpos(float x) {
    const float xc = x < -86.0f ? -86.0f : x;
    const int32_t ni = (int32_t)(xc * 1.44269504f - 0.5f); /* round(x / ln 2), x <= 0 */
    const float n = (float)ni;
    const float r = (xc - n * 0.693145752f) - n * 1.42860677e-6f; /* x - n ln 2, Cody-Waite */
    float p = 1.98756912e-4f;
    p = p * r + 1.39819994e-3f;
    p = p * r + 8.33345205e-3f;
    p = p * r + 4.16657962e-2f;
    p = p * r + 1.66666657e-1f;
    p = p * r + 5.0e-1f;
    p = p * r * r + r + 1.0f; /* e^r, |r| <= ln 2 / 2 */
    int32_t bits;
    memcpy(&bits, &p, 4);
    bits += ni * (1 << 23); /* p * 2^n, n >= -124: stays a normal float */
    float y;
    memcpy(&y, &bits, 4);
    return x < -86.0f ? 0.0f : y;
}

/* a ranks before b: larger key, then lower position (a total order: deterministic). */
static inline int before(float ka, int32_t pa, float kb, int32_t pb) {
    return ka > kb || (ka == kb && pa < pb);
}

/* The heap of best_k: a min-heap (worst at h[0]) of the best k positions so far by key. */
static inline void heap_push(const float *key, int32_t *h, int64_t j, int32_t p) {
    while (j > 0 && before(key[h[(j - 1) / 2]], h[(j - 1) / 2], key[p], p)) { /* sift up */
        h[j] = h[(j - 1) / 2];
        j = (j - 1) / 2;
    }
    h[j] = p;
}

/* p in place of the worst of h[0..k) (the caller checked it ranks before it). */
static inline void heap_replace(const float *key, int32_t *h, int64_t k, int32_t p) {
    int64_t j = 0;
    for (;;) { /* sift down */
        int64_t c = 2 * j + 1;
        if (c >= k) break;
        if (c + 1 < k && before(key[h[c]], h[c], key[h[c + 1]], h[c + 1])) c++;
        if (!before(key[p], p, key[h[c]], h[c])) break;
        h[j] = h[c];
        j = c;
    }
    h[j] = p;
}

/* The heap h[0..k) sorted best-first (heap sort: worst to the back). */
static void heap_sort(const float *key, int32_t *h, int64_t k) {
    for (int64_t end = k - 1; end > 0; end--) {
        const int32_t p = h[end];
        h[end] = h[0];
        heap_replace(key, h, end, p);
    }
}

/* Keeps in pos[0..k) the k best of pos[0..m) by key[pos] (a min-heap of the best so far,
 * sorted best-first at the end); returns k (or m if smaller). */
static int64_t best_k(const float *key, int32_t *pos, int64_t m, int64_t k) {
    if (k >= m) k = m;
    for (int64_t i = 0; i < m; i++) {
        const int32_t p = pos[i];
        if (i < k) heap_push(key, pos, i, p); /* the heap lives in the first k slots */
        else if (before(key[p], p, key[pos[0]], pos[0])) heap_replace(key, pos, k, p);
    }
    heap_sort(key, pos, k);
    return k;
}

#define SKIP_RUN 64 /* positions tested together against the heap's worst */

/* best_k over every position 0..n-1 (written to pos[0..k)): runs of positions none of which
 * beats the heap's worst are passed over by one vectorised compare. A position comes after
 * every one already in the heap, so it enters only with a strictly larger key: the result is
 * best_k's, ties included. *nan: whether any key is a NaN (then the order is meaningless). */
static int64_t best_k_all(const float *key, int64_t n, int64_t k, int32_t *pos, int *nan) {
    if (k >= n) k = n;
    int bad = 0;
    for (int64_t i = 0; i < k; i++) {
        bad |= key[i] != key[i];
        heap_push(key, pos, i, (int32_t)i);
    }
    for (int64_t i = k; i < n;) {
        if (i + SKIP_RUN <= n) {
            const float worst = key[pos[0]];
            int any = 0, odd = 0;
            for (int j = 0; j < SKIP_RUN; j++) {
                any |= key[i + j] > worst;
                odd |= key[i + j] != key[i + j];
            }
            bad |= odd;
            if (!any) {
                i += SKIP_RUN;
                continue;
            }
        }
        const int64_t end = i + SKIP_RUN < n ? i + SKIP_RUN : n;
        for (; i < end; i++) {
            bad |= key[i] != key[i];
            if (key[i] > key[pos[0]]) heap_replace(key, pos, k, (int32_t)i);
        }
    }
    *nan = bad;
    heap_sort(key, pos, k);
    return k;
}

/* pos[0..c) (ascending positions) sorted best-first by w[pos], ties by lower position: the
 * order best_k gives, in linear time, for nuclei of many thousand candidates (a heap sort of
 * a flat 262k-token distribution took tens of ms per draw). A stable LSD radix sort on the
 * weights' bits (w >= 0: the bits of a non-negative float order as the float does), inverted
 * for descending order; stability keeps equal weights in position order. A pass whose digit
 * is the same for every candidate (the high bits of weights within a few octaves) is
 * skipped. */
#define RADIX_MIN 2048 /* fewer candidates: the heap sort is as fast */
#define RADIX_BITS 11
#define RADIX_PASSES ((32 + RADIX_BITS - 1) / RADIX_BITS)
static void sort_by_weight(const float *w, int32_t *pos, int64_t c) {
    enum { BUCKETS = 1 << RADIX_BITS };
    int32_t count[RADIX_PASSES][BUCKETS]; /* c <= INT32_MAX (ds4n_sample checks n) */
    memset(count, 0, sizeof count);
    /* locals, not the thread-local pointers: the loops below would fetch those per item */
    uint32_t *key = key_buf, *key2 = key_tmp;
    int32_t *p1 = pos, *p2 = pos_tmp;
    for (int64_t j = 0; j < c; j++) {
        uint32_t bits;
        memcpy(&bits, &w[pos[j]], 4);
        key[j] = ~bits;
        for (int d = 0; d < RADIX_PASSES; d++)
            count[d][(key[j] >> (d * RADIX_BITS)) & (BUCKETS - 1)]++;
    }
    for (int d = 0; d < RADIX_PASSES; d++) {
        const int shift = d * RADIX_BITS;
        int32_t *at = count[d];
        if (at[(key[0] >> shift) & (BUCKETS - 1)] == c) continue; /* one digit for all */
        int32_t sum = 0;
        for (int b = 0; b < BUCKETS; b++) {
            const int32_t k = at[b];
            at[b] = sum;
            sum += k;
        }
        for (int64_t j = 0; j < c; j++) {
            const int32_t to = at[(key[j] >> shift) & (BUCKETS - 1)]++;
            key2[to] = key[j];
            p2[to] = p1[j];
        }
        uint32_t *kt = key;
        key = key2;
        key2 = kt;
        int32_t *pt = p1;
        p1 = p2;
        p2 = pt;
    }
    if (p1 != pos) memcpy(pos, p1, sizeof *pos * (size_t)c);
}

/* The smallest best-first prefix of pos[0..m) whose probability (at temperature 1) reaches
 * top_p: moved first, best-first; returns its length. w: per position scratch; mx: the
 * largest of the candidates' values (the best token is always among them). */
static int64_t top_p_prefix(const float *values, int32_t *pos, int64_t m, float top_p, float *w,
                            int64_t n, float mx) {
    double total = 0.0;
    if (m == n) { /* every position: a contiguous, vectorisable pass */
        for (int64_t i = 0; i < n; i++) w[i] = exp_nonpos(values[i] - mx);
        /* four running sums, so the adds do not wait on each other */
        double part[4] = {0.0, 0.0, 0.0, 0.0};
        int64_t i = 0;
        for (; i + 4 <= n; i += 4)
            for (int l = 0; l < 4; l++) part[l] += w[i + l];
        for (; i < n; i++) part[0] += w[i];
        total = (part[0] + part[1]) + (part[2] + part[3]);
    } else {
        for (int64_t j = 0; j < m; j++) total += w[pos[j]] = exp_nonpos(values[pos[j]] - mx);
    }
    const double target = (double)top_p * total;
    double mass = 0.0;
    if (m == n && n > 64) {
        /* Usually a few candidates carry the mass: look at the best 64 first (every position
         * is a candidate here, so the list is rebuilt if they fall short). */
        int unused;
        const int64_t c = best_k_all(w, n, 64, pos, &unused);
        for (int64_t j = 0; j < c; j++)
            if ((mass += w[pos[j]]) >= target) return j + 1;
        for (int64_t i = 0; i < n; i++) pos[i] = (int32_t)i;
    }
    /* The prefix lies among the candidates at or above tau: all those below it weigh less
     * than (1 - top_p) of the total together. */
    const double tau = (1.0 - (double)top_p) * total / (double)m;
    int64_t c = 0;
    for (int64_t j = 0; j < m; j++)
        if (w[pos[j]] >= tau) pos[c++] = pos[j];
    /* every position was a candidate (m == n): they are in ascending order, as the radix
     * sort's ties need */
    if (m == n && c >= RADIX_MIN) sort_by_weight(w, pos, c);
    else c = best_k(w, pos, c, c);
    mass = 0.0;
    for (int64_t j = 0; j < c; j++)
        if ((mass += w[pos[j]]) >= target) return j + 1;
    return c;
}

/* 4 floats in the compiler's generic vectors (SSE2 / NEON registers, gcc and clang alike):
 * the argmax pass below as selects on compares, which the compiler does not find itself. */
typedef float f4 __attribute__((vector_size(16)));
typedef int32_t i4 __attribute__((vector_size(16)));
#define RUNS 4 /* independent running maxima of 4 lanes */

/* The maximum of values[0..n) (n > 0; NaNs aside) in *mx, and whether any is a NaN. */
static int max_and_nan(const float *values, int64_t n, float *mx) {
    f4 m[RUNS];
    i4 nan[RUNS];
    for (int j = 0; j < RUNS; j++) m[j] = (f4){values[0], values[0], values[0], values[0]};
    for (int j = 0; j < RUNS; j++) nan[j] = (i4){0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 4 * RUNS <= n; i += 4 * RUNS)
        for (int j = 0; j < RUNS; j++) {
            f4 v;
            memcpy(&v, values + i + 4 * j, sizeof v);
            const i4 gt = v > m[j];
            m[j] = (f4)(((i4)v & gt) | ((i4)m[j] & ~gt));
            nan[j] |= v != v;
        }
    float best = values[0];
    int any = 0;
    for (int j = 0; j < RUNS; j++)
        for (int l = 0; l < 4; l++) {
            best = m[j][l] > best ? m[j][l] : best;
            any |= nan[j][l] != 0;
        }
    for (; i < n; i++) {
        any |= values[i] != values[i];
        best = values[i] > best ? values[i] : best;
    }
    *mx = best;
    return any;
}

int64_t ds4n_sample(const float *values, int64_t n, int32_t top_k, float top_p, float min_p,
                    float temperature, double u) {
    if (!values || n <= 0 || n > INT32_MAX || !(temperature > 0.0f) || top_k < 0 ||
        !(top_p > 0.0f && top_p <= 1.0f) || !(min_p >= 0.0f && min_p <= 1.0f) ||
        !(u >= 0.0 && u < 1.0))
        return -1;
    if (grow(n) != 0) return -2;
    float *w = w_buf;
    int32_t *pos = pos_buf;
    /* argmax as numpy's: the first NaN if any, else the first maximum; with top_k it is the
     * first of the k best (ties go to the lower position), found in the same pass. */
    float vbest;
    int nan;
    int64_t m = n, best = 0;
    if (top_k > 0 && top_k < n) {
        m = best_k_all(values, n, top_k, pos, &nan);
        best = pos[0];
        vbest = values[best];
    } else {
        nan = max_and_nan(values, n, &vbest);
        if (!nan)
            while (values[best] != vbest) best++;
    }
    if (nan) {
        best = 0;
        while (!isnan(values[best])) best++;
        return best;
    }
    if (!isfinite(vbest)) return best;
    if (m == n)
        for (int64_t i = 0; i < n; i++) pos[i] = (int32_t)i;
    if (top_p < 1.0f) m = top_p_prefix(values, pos, m, top_p, w, n, vbest);
    if (min_p > 0.0f) {
        const float cut = vbest + (float)log((double)min_p);
        int64_t kept = 0;
        for (int64_t j = 0; j < m; j++)
            if (values[pos[j]] >= cut) pos[kept++] = pos[j];
        m = kept;
    }
    /* the candidates' values gathered in order, so that their weights are one vectorised
     * pass (a nucleus can hold most of a vocabulary) */
    float *wj = draw_buf;
    for (int64_t j = 0; j < m; j++) wj[j] = values[pos[j]];
    for (int64_t j = 0; j < m; j++) wj[j] = exp_nonpos((wj[j] - vbest) / temperature);
    double total = 0.0;
    for (int64_t j = 0; j < m; j++) total += wj[j];
    const double target = u * total;
    double run = 0.0;
    for (int64_t j = 0; j < m; j++)
        if ((run += wj[j]) > target) return pos[j];
    for (int64_t j = m - 1; j >= 0; j--) /* rounding at the end */
        if (wj[j] > 0.0f) return pos[j];
    return best;
}
