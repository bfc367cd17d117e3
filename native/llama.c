/* The llama-family forward pass (see llama.h), composed of the shared decoder pieces
 * (decoder.h). Per layer: RMSNorm, attention (Q/K/V with optional biases, RoPE of
 * llama.cpp's NORMAL type, causal GQA over the KV cache, output projection), residual,
 * RMSNorm, SwiGLU FFN, residual. */
#include "llama.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "decoder.h"

struct ds4n_llama {
    ds4n_llama_hparams hp;
    ds4n_dec_dims dims;
    const void **w;           /* DS4N_LLAMA_N_GLOBAL + n_layer * DS4N_LLAMA_N_PER_LAYER */
    int32_t *type;
    ds4n_rope rope;
    int64_t embd_row_bytes;
};

struct ds4n_llama_session {
    const ds4n_llama *model;
    int64_t n_ctx, n_past;
    ds4n_kv kv;
    ds4n_dec_ws ws;
    int64_t cap_tok;
    float *x, *xn, *tmp;      /* residual stream, normalized rows, a step's output */
};

static const void *weight(const ds4n_llama *m, int il, int slot) {
    return m->w[DS4N_LLAMA_N_GLOBAL + il * DS4N_LLAMA_N_PER_LAYER + slot];
}
static int wtype(const ds4n_llama *m, int il, int slot) {
    return m->type[DS4N_LLAMA_N_GLOBAL + il * DS4N_LLAMA_N_PER_LAYER + slot];
}

static void *alloc_floats(int64_t n) {
    size_t bytes = ((size_t)n * sizeof(float) + 63) / 64 * 64;
    return aligned_alloc(64, bytes ? bytes : 64);
}

/* ---- model ------------------------------------------------------------------------ */

ds4n_llama *ds4n_llama_new(const ds4n_llama_hparams *hp, const void *const *tensors,
                           const int32_t *types) {
    if (hp->n_layer <= 0 || hp->n_head <= 0 || hp->n_head_kv <= 0 ||
        hp->n_head % hp->n_head_kv != 0 || hp->head_dim <= 0 || hp->head_dim % 2 != 0 ||
        hp->n_rot <= 0 || hp->n_rot > hp->head_dim || hp->n_rot % 2 != 0 ||
        hp->n_vocab <= 0 || hp->n_embd <= 0 || hp->n_ff <= 0)
        return NULL;
    const int n_slots = DS4N_LLAMA_N_GLOBAL + hp->n_layer * DS4N_LLAMA_N_PER_LAYER;
    ds4n_llama *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->hp = *hp;
    m->dims = (ds4n_dec_dims){.n_embd = hp->n_embd, .n_head = hp->n_head,
                              .n_head_kv = hp->n_head_kv, .head_dim = hp->head_dim,
                              .n_ff = hp->n_ff, .norm_eps = hp->rms_eps};
    m->w = malloc(sizeof(void *) * n_slots);
    m->type = malloc(sizeof(int32_t) * n_slots);
    if (!m->w || !m->type) {
        ds4n_llama_free(m);
        return NULL;
    }
    memcpy(m->w, tensors, sizeof(void *) * n_slots);
    memcpy(m->type, types, sizeof(int32_t) * n_slots);
    const ds4n_rope_params rp = {
        .n_rot = hp->n_rot, .mode = DS4N_ROPE_NORMAL, .base = hp->rope_base,
        .freq_scale = hp->rope_scale, .freq_factors = m->w[DS4N_LLAMA_ROPE_FREQS],
        .ext_factor = hp->yarn_ext_factor, .attn_factor = hp->rope_attn_factor,
        .beta_fast = hp->yarn_beta_fast, .beta_slow = hp->yarn_beta_slow,
        .n_ctx_orig = hp->n_ctx_orig,
    };
    if (ds4n_rope_init(&m->rope, &rp) != 0) {
        ds4n_llama_free(m);
        return NULL;
    }
    const int et = m->type[DS4N_LLAMA_TOKEN_EMBD];
    m->embd_row_bytes = hp->n_embd / ds4n_type_block_size(et) * ds4n_type_block_bytes(et);
    return m;
}

void ds4n_llama_free(ds4n_llama *m) {
    if (!m) return;
    free(m->w);
    free(m->type);
    free(m);
}

/* ---- session ---------------------------------------------------------------------- */

ds4n_llama_session *ds4n_llama_session_new(const ds4n_llama *model, int64_t n_ctx) {
    if (n_ctx <= 0) return NULL;
    ds4n_llama_session *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->model = model;
    s->n_ctx = n_ctx;
    const ds4n_llama_hparams *hp = &model->hp;
    if (ds4n_kv_init(&s->kv, hp->n_layer, hp->n_head_kv, hp->head_dim, n_ctx) != 0) {
        free(s);
        return NULL;
    }
    return s;
}

static void free_scratch(ds4n_llama_session *s) {
    free(s->x);
    free(s->xn);
    free(s->tmp);
    s->x = s->xn = s->tmp = NULL;
    s->cap_tok = 0;
}

void ds4n_llama_session_free(ds4n_llama_session *s) {
    if (!s) return;
    free_scratch(s);
    ds4n_dec_ws_release(&s->ws);
    ds4n_kv_release(&s->kv);
    free(s);
}

int64_t ds4n_llama_session_n_past(const ds4n_llama_session *s) { return s->n_past; }
int64_t ds4n_llama_session_n_ctx(const ds4n_llama_session *s) { return s->n_ctx; }
int64_t ds4n_llama_session_kv_bytes(const ds4n_llama_session *s) { return ds4n_kv_bytes(&s->kv); }

int ds4n_llama_session_set_n_past(ds4n_llama_session *s, int64_t n) {
    if (n < 0 || n > s->n_ctx) return -1;
    s->n_past = n;
    return 0;
}

static int ensure_scratch(ds4n_llama_session *s, int64_t T, int n_threads) {
    const int E = s->model->hp.n_embd;
    if (T > s->cap_tok) {
        free_scratch(s);
        s->x = alloc_floats(T * E);
        s->xn = alloc_floats(T * E);
        s->tmp = alloc_floats(T * E);
        if (!s->x || !s->xn || !s->tmp) {
            free_scratch(s);
            return -1;
        }
        s->cap_tok = T;
    }
    return ds4n_dec_ws_reserve(&s->ws, &s->model->dims, T, n_threads);
}

static void add_rows(float *x, const float *y, int64_t T, int n) {
    for (int64_t i = 0; i < T * n; i++) x[i] += y[i];
}

/* ---- eval ----------------------------------------------------------------------------- */

int ds4n_llama_eval(const ds4n_llama *m, ds4n_llama_session *s, ds4n_pool *pool,
                    const int32_t *tokens, int64_t T, float *logits, int all_logits) {
    const ds4n_llama_hparams *hp = &m->hp;
    if (T <= 0) return DS4N_OK;
    if (T > s->n_ctx - s->n_past) return DS4N_ERR_CONTEXT_FULL;
    for (int64_t t = 0; t < T; t++)
        if (tokens[t] < 0 || tokens[t] >= hp->n_vocab) return DS4N_ERR_BAD_TOKEN;
    const int nth = pool ? ds4n_pool_threads(pool) : 1;
    if (ensure_scratch(s, T, nth) != 0) return DS4N_ERR_NO_MEMORY;

    const int E = hp->n_embd;
    const char *embd = m->w[DS4N_LLAMA_TOKEN_EMBD];
    for (int64_t t = 0; t < T; t++)
        ds4n_dequantize(m->type[DS4N_LLAMA_TOKEN_EMBD], embd + tokens[t] * m->embd_row_bytes,
                        s->x + t * E, E);
    for (int il = 0; il < hp->n_layer; il++) {
        const ds4n_attn_layer al = {
            .wq = weight(m, il, DS4N_LLAMA_WQ), .tq = wtype(m, il, DS4N_LLAMA_WQ),
            .wk = weight(m, il, DS4N_LLAMA_WK), .tk = wtype(m, il, DS4N_LLAMA_WK),
            .wv = weight(m, il, DS4N_LLAMA_WV), .tv = wtype(m, il, DS4N_LLAMA_WV),
            .wo = weight(m, il, DS4N_LLAMA_WO), .to = wtype(m, il, DS4N_LLAMA_WO),
            .bq = weight(m, il, DS4N_LLAMA_BQ), .bk = weight(m, il, DS4N_LLAMA_BK),
            .bv = weight(m, il, DS4N_LLAMA_BV), .bo = weight(m, il, DS4N_LLAMA_BO),
            .rope = &m->rope, .q_scale = 1.0f / sqrtf((float)hp->head_dim),
        };
        ds4n_rms_norm(s->x, weight(m, il, DS4N_LLAMA_ATTN_NORM), s->xn, T, E, hp->rms_eps);
        ds4n_attention(&m->dims, &al, &s->kv, il, &s->ws, pool, s->xn, T, s->n_past, s->tmp);
        add_rows(s->x, s->tmp, T, E);

        const ds4n_ffn_layer fl = {
            .gate = weight(m, il, DS4N_LLAMA_W_GATE), .tgate = wtype(m, il, DS4N_LLAMA_W_GATE),
            .up = weight(m, il, DS4N_LLAMA_W_UP), .tup = wtype(m, il, DS4N_LLAMA_W_UP),
            .down = weight(m, il, DS4N_LLAMA_W_DOWN), .tdown = wtype(m, il, DS4N_LLAMA_W_DOWN),
            .act = DS4N_ACT_SILU,
        };
        ds4n_rms_norm(s->x, weight(m, il, DS4N_LLAMA_FFN_NORM), s->xn, T, E, hp->rms_eps);
        ds4n_ffn(&m->dims, &fl, &s->ws, pool, s->xn, T, s->tmp);
        add_rows(s->x, s->tmp, T, E);
    }
    s->n_past += T;

    if (logits) {
        const int64_t first = all_logits ? 0 : T - 1, rows = T - first;
        ds4n_rms_norm(s->x + first * E, m->w[DS4N_LLAMA_OUTPUT_NORM], s->xn, rows, E,
                      hp->rms_eps);
        const int head = m->w[DS4N_LLAMA_OUTPUT] ? DS4N_LLAMA_OUTPUT : DS4N_LLAMA_TOKEN_EMBD;
        ds4n_matmul(pool, m->type[head], m->w[head], hp->n_vocab, E, s->xn, rows, logits);
    }
    return DS4N_OK;
}

/* ---- KV rows for save/load ------------------------------------------------------------ */

int ds4n_llama_kv_get(const ds4n_llama_session *s, int il, int which, int64_t n, float *dst) {
    return ds4n_kv_get(&s->kv, il, which, n, dst);
}

int ds4n_llama_kv_set(ds4n_llama_session *s, int il, int which, int64_t n, const float *src) {
    return ds4n_kv_set(&s->kv, il, which, n, src);
}
