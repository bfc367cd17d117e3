/* Mixture-of-experts FFN (see moe.h).
 *
 * One call: router logits (one matmul), gating on the calling thread, then the tokens'
 * (token, slot) rows are grouped by expert and gathered, so every expert the call uses is
 * one matrix product over its rows: gate and up of all active experts in one pool dispatch
 * (each worker takes its share of every expert's rows), the activation in a second, down in
 * a third, and the weighted sum back into token order in a fourth. An expert no token chose
 * is never touched. Each token's sum runs over its slots in rank order, whatever the chunk,
 * so a token gets the same result in a prefill chunk as alone.
 *
 * A batch of sequences (ds4n_moe_forward_batch) groups all their rows by expert too; within
 * an expert the rows stay in token order, so each sequence's rows for it are one run, and
 * each run gets the product it gets alone: a run of more than DS4N_DEC_SMALL_T rows its own
 * call, shorter runs (a decode token's, one row) together as decode rows. */
#include "moe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h" /* ds4n_swiglu */
#include "decoder.h"   /* ds4n_dec_rows_part, DS4N_DEC_SMALL_T */

#define MAX_EXPERTS 65536 /* keeps every count and row index well inside int32 */

struct ds4n_moe_scratch {
    float *logits;    /* T x n_expert */
    int32_t *ids;     /* T x n_used */
    float *weights;   /* T x n_used */
    int32_t *row_of;  /* T x n_used: grouped row of (token, slot) */
    int32_t *expert_of_row;
    int32_t *seq_of_row;  /* T x n_used: the sequence of each grouped row */
    int32_t *count, *first, *active; /* per expert: rows, first row; active expert ids */
    float *probs;                    /* n_expert: one token's gating values */
    uint8_t *taken;                  /* n_expert: top-k bookkeeping */
    float *xg, *g, *u, *y;           /* grouped rows: inputs, gate/activation, up, outputs */
    int64_t cap[15];
    int64_t expert_bytes;
};

static int grow(void **p, int64_t *cap, int64_t bytes) {
    if (bytes <= *cap) return 0;
    size_t size = ((size_t)bytes + 63) / 64 * 64;
    void *q = aligned_alloc(64, size);
    if (!q) return -1;
    free(*p);
    *p = q;
    *cap = (int64_t)size;
    return 0;
}

ds4n_moe_scratch *ds4n_moe_scratch_new(void) { return calloc(1, sizeof(ds4n_moe_scratch)); }

void ds4n_moe_scratch_free(ds4n_moe_scratch *s) {
    if (!s) return;
    void *bufs[] = {s->logits, s->ids, s->weights, s->row_of, s->expert_of_row, s->count,
                    s->first, s->active, s->xg, s->g, s->u, s->y, s->probs, s->taken,
                    s->seq_of_row};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(bufs[i]);
    free(s);
}

int64_t ds4n_moe_expert_bytes(const ds4n_moe_scratch *s) { return s->expert_bytes; }

static int64_t row_bytes(int type, int64_t n) {
    return n / ds4n_type_block_size(type) * ds4n_type_block_bytes(type);
}

static int whole_blocks(int type, int64_t n) {
    return ds4n_type_supported(type) && n % ds4n_type_block_size(type) == 0;
}

int ds4n_moe_valid(const ds4n_moe *m) {
    if (!m || m->n_expert <= 0 || m->n_expert > MAX_EXPERTS || m->n_used <= 0 ||
        m->n_used > m->n_expert || m->n_embd <= 0 || m->n_ff <= 0)
        return 0;
    if (m->gating != DS4N_MOE_SOFTMAX && m->gating != DS4N_MOE_SIGMOID &&
        m->gating != DS4N_MOE_SOFTMAX_WEIGHT)
        return 0;
    if (m->activation != DS4N_MOE_SWIGLU && m->activation != DS4N_MOE_SWIGLU_OAI) return 0;
    if (!m->router || !m->gate || !m->up || !m->down) return 0;
    return whole_blocks(m->router_type, m->n_embd) && whole_blocks(m->gate_type, m->n_embd) &&
           whole_blocks(m->up_type, m->n_embd) && whole_blocks(m->down_type, m->n_ff);
}

/* ---- gating ------------------------------------------------------------------------- */

/* v ranks above w: greater, or a number against NaN. */
static int ranks_above(float v, float w) { return v > w || (isnan(w) && !isnan(v)); }

/* The k best of v[0..n) into ids, best first, ties to the lower index; taken: n bytes. */
static void top_k(const float *v, int n, int k, int32_t *ids, uint8_t *taken) {
    memset(taken, 0, (size_t)n);
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < n; e++)
            if (!taken[e] && (best < 0 || ranks_above(v[e], v[best]))) best = e;
        taken[best] = 1;
        ids[j] = best;
    }
}

/* In place; sums in double. */
static void softmax(float *v, int n) {
    float mx = -INFINITY;
    for (int i = 0; i < n; i++) mx = fmaxf(mx, v[i]);
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        v[i] = expf(v[i] - mx);
        sum += v[i];
    }
    for (int i = 0; i < n; i++) v[i] = (float)(v[i] / sum);
}

/* ds4n_moe_route with its working memory: probs (n_expert floats), taken (n_expert bytes). */
static void route(const ds4n_moe *m, const float *logits, int64_t T, int32_t *ids,
                  float *weights, float *probs, uint8_t *taken) {
    const int n = m->n_expert, k = m->n_used;
    for (int64_t t = 0; t < T; t++) {
        int32_t *id = ids + t * k;
        float *w = weights + t * k;
        memcpy(probs, logits + t * n, sizeof(float) * n);
        if (m->gating == DS4N_MOE_SOFTMAX) softmax(probs, n);
        if (m->gating == DS4N_MOE_SIGMOID)
            for (int e = 0; e < n; e++) probs[e] = 1.0f / (1.0f + expf(-probs[e]));
        top_k(probs, n, k, id, taken);
        for (int j = 0; j < k; j++) w[j] = probs[id[j]];
        if (m->gating == DS4N_MOE_SOFTMAX_WEIGHT) softmax(w, k);
        if (m->norm_weights) {
            double sum = 0.0;
            for (int j = 0; j < k; j++) sum += w[j];
            /* as llama.cpp: a floor of the smallest normal half keeps the division finite */
            if (sum < 6.103515625e-5) sum = 6.103515625e-5;
            for (int j = 0; j < k; j++) w[j] = (float)(w[j] / sum);
        }
        if (m->weights_scale != 0.0f && m->weights_scale != 1.0f)
            for (int j = 0; j < k; j++) w[j] *= m->weights_scale;
    }
}

int ds4n_moe_route(const ds4n_moe *m, const float *logits, int64_t T, int32_t *ids,
                   float *weights) {
    float *probs = malloc(sizeof(float) * (size_t)m->n_expert);
    uint8_t *taken = malloc((size_t)m->n_expert);
    const int ok = probs && taken;
    if (ok) route(m, logits, T, ids, weights, probs, taken);
    free(probs);
    free(taken);
    return ok ? DS4N_MOE_OK : DS4N_MOE_ERR_NO_MEMORY;
}

/* ---- experts -------------------------------------------------------------------------- */

typedef struct {
    const ds4n_moe *m;
    ds4n_moe_scratch *s;
    int n_active;
    int64_t rows, T;
    const float *x;
    float *out;
} moe_ctx;

/* Y = X Wᵀ over the grouped rows [r0, r0 + n) of one expert (X, Y at row r0), each
 * sequence's run as it is computed alone (see the top of this file). */
static void expert_product(const ds4n_moe_scratch *s, int type, const void *W, int64_t rows,
                           int64_t K, const float *X, int64_t r0, int64_t n, float *Y, int ith,
                           int nth) {
    const int32_t *seq = s->seq_of_row + r0;
    int64_t r = 0;
    while (r < n) {
        int64_t q = r + 1;
        while (q < n && seq[q] == seq[r]) q++;
        if (q - r > DS4N_DEC_SMALL_T) {
            ds4n_matmul_part(type, W, rows, K, X + r * K, q - r, Y + r * rows, ith, nth);
            r = q;
            continue;
        }
        int64_t z = q; /* the following short runs join this one */
        while (z < n) {
            int64_t z2 = z + 1;
            while (z2 < n && seq[z2] == seq[z]) z2++;
            if (z2 - z > DS4N_DEC_SMALL_T) break;
            z = z2;
        }
        ds4n_dec_rows_part(type, W, rows, K, X + r * K, z - r, 1, Y + r * rows, ith, nth);
        r = z;
    }
}

static const uint8_t *expert_matrix(const void *base, int type, int64_t rows, int64_t cols,
                                    int e) {
    return (const uint8_t *)base + (int64_t)e * rows * row_bytes(type, cols);
}

/* Worker ith of nth's share of Y = X Wᵀ over expert e's grouped rows (X rows of cols, Y
 * rows of rows, both at the expert's first row), W its rows x cols slice of base. */
static void expert_rows(const moe_ctx *c, int e, int type, const void *base, int64_t rows,
                        int64_t cols, const float *X, float *Y, int ith, int nth) {
    const ds4n_moe_scratch *s = c->s;
    const int64_t r0 = s->first[e], n = s->count[e];
    expert_product(s, type, expert_matrix(base, type, rows, cols, e), rows, cols, X + r0 * cols,
                   r0, n, Y + r0 * rows, ith, nth);
}

static void gate_up_task(void *p, int ith, int nth) {
    const moe_ctx *c = p;
    const ds4n_moe *m = c->m;
    const ds4n_moe_scratch *s = c->s;
    for (int a = 0; a < c->n_active; a++) {
        const int e = s->active[a];
        expert_rows(c, e, m->gate_type, m->gate, m->n_ff, m->n_embd, s->xg, s->g, ith, nth);
        expert_rows(c, e, m->up_type, m->up, m->n_ff, m->n_embd, s->xg, s->u, ith, nth);
    }
}

static void activate_rows(const moe_ctx *c, int64_t r0, int64_t r1) {
    const ds4n_moe *m = c->m;
    const ds4n_moe_scratch *s = c->s;
    const int64_t F = m->n_ff;
    for (int64_t r = r0; r < r1; r++) {
        const int e = s->expert_of_row[r];
        float *g = s->g + r * F, *u = s->u + r * F;
        if (m->gate_bias)
            for (int64_t i = 0; i < F; i++) g[i] += m->gate_bias[e * F + i];
        if (m->up_bias)
            for (int64_t i = 0; i < F; i++) u[i] += m->up_bias[e * F + i];
        if (m->activation == DS4N_MOE_SWIGLU) {
            ds4n_swiglu(g, u, F);
            continue;
        }
        const float alpha = m->oai_alpha, limit = m->oai_limit;
        for (int64_t i = 0; i < F; i++) {
            const float gi = fminf(g[i], limit), ui = fminf(fmaxf(u[i], -limit), limit);
            g[i] = gi / (1.0f + expf(-alpha * gi)) * (ui + 1.0f);
        }
    }
}

static void activate_task(void *p, int ith, int nth) {
    const moe_ctx *c = p;
    activate_rows(c, c->rows * ith / nth, c->rows * (ith + 1) / nth);
}

static void down_task(void *p, int ith, int nth) {
    const moe_ctx *c = p;
    const ds4n_moe *m = c->m;
    const ds4n_moe_scratch *s = c->s;
    for (int a = 0; a < c->n_active; a++)
        expert_rows(c, s->active[a], m->down_type, m->down, m->n_embd, m->n_ff, s->g, s->y, ith,
                    nth);
}

static void combine_tokens(const moe_ctx *c, int64_t t0, int64_t t1) {
    const ds4n_moe *m = c->m;
    const ds4n_moe_scratch *s = c->s;
    const int64_t E = m->n_embd, k = m->n_used;
    for (int64_t t = t0; t < t1; t++) {
        float *o = c->out + t * E;
        for (int64_t i = 0; i < E; i++) o[i] = 0.0f;
        for (int64_t j = 0; j < k; j++) {
            const float w = s->weights[t * k + j];
            const float *y = s->y + (int64_t)s->row_of[t * k + j] * E;
            const float *b = m->down_bias ? m->down_bias + (int64_t)s->ids[t * k + j] * E : NULL;
            if (b)
                for (int64_t i = 0; i < E; i++) o[i] += w * (y[i] + b[i]);
            else
                for (int64_t i = 0; i < E; i++) o[i] += w * y[i];
        }
    }
}

static void combine_task(void *p, int ith, int nth) {
    const moe_ctx *c = p;
    combine_tokens(c, c->T * ith / nth, c->T * (ith + 1) / nth);
}

int ds4n_moe_scratch_reserve(ds4n_moe_scratch *s, const ds4n_moe *m, int64_t T) {
    if (T > INT32_MAX / m->n_used) return DS4N_MOE_ERR_NO_MEMORY; /* rows are int32 */
    const int64_t R = T * m->n_used, n = m->n_expert, E = m->n_embd, F = m->n_ff;
    const int64_t f = sizeof(float), i = sizeof(int32_t);
    void **bufs[] = {(void **)&s->logits, (void **)&s->ids, (void **)&s->weights,
                     (void **)&s->row_of, (void **)&s->expert_of_row, (void **)&s->count,
                     (void **)&s->first, (void **)&s->active, (void **)&s->xg,
                     (void **)&s->g, (void **)&s->u, (void **)&s->y, (void **)&s->probs,
                     (void **)&s->taken, (void **)&s->seq_of_row};
    const int64_t need[] = {T * n * f, R * i, R * f, R * i, R * i, n * i, n * i,
                            n * i, R * E * f, R * F * f, R * F * f, R * E * f, n * f, n, R * i};
    for (size_t b = 0; b < sizeof need / sizeof *need; b++)
        if (grow(bufs[b], &s->cap[b], need[b]) != 0) return DS4N_MOE_ERR_NO_MEMORY;
    return DS4N_MOE_OK;
}

int ds4n_moe_forward(ds4n_pool *pool, const ds4n_moe *m, ds4n_moe_scratch *s, const float *x,
                     int64_t T, float *out) {
    if (T <= 0) return DS4N_MOE_OK;
    return ds4n_moe_forward_batch(pool, m, s, x, &T, 1, out);
}

int ds4n_moe_forward_batch(ds4n_pool *pool, const ds4n_moe *m, ds4n_moe_scratch *s,
                           const float *x, const int64_t *count, int n_seq, float *out) {
    int64_t T = 0;
    for (int i = 0; i < n_seq; i++) {
        if (count[i] < 1 || count[i] > INT32_MAX - T) return DS4N_MOE_ERR_NO_MEMORY;
        T += count[i];
    }
    if (T <= 0) return DS4N_MOE_OK;
    if (ds4n_moe_scratch_reserve(s, m, T) != 0) return DS4N_MOE_ERR_NO_MEMORY;
    const int n = m->n_expert, k = m->n_used;
    const int64_t E = m->n_embd, F = m->n_ff, R = T * k;

    ds4n_dec_project(pool, m->router_type, m->router, n, E, x, count, n_seq, s->logits);
    if (m->router_bias)
        for (int64_t t = 0; t < T; t++)
            for (int e = 0; e < n; e++) s->logits[t * n + e] += m->router_bias[e];
    route(m, s->logits, T, s->ids, s->weights, s->probs, s->taken);
    for (int64_t r = 0; r < R; r++)
        if (s->ids[r] < 0 || s->ids[r] >= n) return DS4N_MOE_ERR_BAD_EXPERT;

    /* Group the (token, slot) rows by expert, in token order within an expert. */
    memset(s->count, 0, sizeof(int32_t) * n);
    for (int64_t r = 0; r < R; r++) s->count[s->ids[r]]++;
    int n_active = 0;
    int32_t next = 0;
    for (int e = 0; e < n; e++) {
        s->first[e] = next;
        next += s->count[e];
        if (s->count[e]) s->active[n_active++] = e;
    }
    for (int a = 0; a < n_active; a++) s->count[s->active[a]] = 0; /* refilled below */
    int32_t seq = 0;
    int64_t seq_end = count[0] * k;
    for (int64_t r = 0; r < R; r++) {
        while (r >= seq_end) seq_end += count[++seq] * k;
        const int e = s->ids[r];
        const int32_t row = s->first[e] + s->count[e]++;
        s->row_of[r] = row;
        s->expert_of_row[row] = e;
        s->seq_of_row[row] = seq;
        memcpy(s->xg + (int64_t)row * E, x + (r / k) * E, sizeof(float) * E);
    }
    const int64_t per_expert =
        F * (row_bytes(m->gate_type, E) + row_bytes(m->up_type, E)) +
        E * row_bytes(m->down_type, F) +
        (int64_t)sizeof(float) * (F * (!!m->gate_bias + !!m->up_bias) + E * !!m->down_bias);
    s->expert_bytes += n_active * per_expert;

    moe_ctx c = {.m = m, .s = s, .n_active = n_active, .rows = R, .T = T, .x = x, .out = out};
    ds4n_pool_run(pool, gate_up_task, &c);
    if (T == 1)
        activate_rows(&c, 0, R); /* a few thousand values: not worth a dispatch */
    else
        ds4n_pool_run(pool, activate_task, &c);
    ds4n_pool_run(pool, down_task, &c);
    if (T == 1)
        combine_tokens(&c, 0, 1);
    else
        ds4n_pool_run(pool, combine_task, &c);
    return DS4N_MOE_OK;
}
