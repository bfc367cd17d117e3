/* Directional steering (activation addition) and residual capture, shared by every family.
 *
 * A steering object holds one direction per layer (n_layer x n_embd float32, a zero row for
 * a layer left alone) and two scales. A family calls ds4n_steer_rows on the rows of a
 * sequence right after a layer's attention output and right after its FFN output (an
 * attention decoder after adding them to the residual stream, which is the same sum):
 *
 *   rows[r] += attn_scale * dir[layer]   after attention   (ds4's --directional-steering-attn)
 *   rows[r] += ffn_scale  * dir[layer]   after the FFN     (llama.cpp's control vectors)
 *
 * A scale of 0 leaves the rows untouched (bit-identical to no steering).
 *
 * Capture: when made with capture on, the object records, before any steering is added,
 * the last row each FFN call of each layer sees (the last token's residual stream after
 * that layer, for an attention decoder); ds4n_steer_captured copies it out. Building a
 * direction evaluates each prompt in its own session with a capturing object.
 *
 * One object may be shared by any number of sessions (it is read-only once made, except
 * the capture rows, so a capturing object belongs to one session at a time). */
#ifndef DS4N_STEER_H
#define DS4N_STEER_H

#include <stdint.h>

#include "decoder.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ds4n_steer ds4n_steer;

enum { DS4N_STEER_ATTN = 0, DS4N_STEER_FFN = 1 };

/* dir: n_layer x n_embd floats, copied (NULL: all zero, e.g. for capture alone). NULL on a
 * bad size, a non-finite value or scale, or no memory. */
ds4n_steer *ds4n_steer_new(int32_t n_layer, int32_t n_embd, const float *dir, float attn_scale,
                           float ffn_scale, int capture);
void ds4n_steer_free(ds4n_steer *s);
int32_t ds4n_steer_n_layer(const ds4n_steer *s);
int32_t ds4n_steer_n_embd(const ds4n_steer *s);
/* Copies the captured rows (n_layer x n_embd; zero for a layer not yet seen) to out:
 * 0, or -1 when the object does not capture. */
int ds4n_steer_captured(const ds4n_steer *s, float *out);

/* The hook: n rows of n_embd of one sequence at layer il, where = DS4N_STEER_ATTN or _FFN.
 * s NULL: nothing. */
void ds4n_steer_rows(ds4n_steer *s, int il, int where, float *rows, int64_t n);

/* An attention decoder's residual add with the hook: b->x += b->tmp over every row, then
 * each sequence's session steering (ds4n_dec_session_set_steer) on its own rows. */
void ds4n_dec_residual(ds4n_dec_batch *b, int il, int where);

/* Attaches s to the session (NULL detaches; the caller keeps s alive while attached).
 * 0, or -1 when s is of another n_embd or layer count than the session. */
int ds4n_dec_session_set_steer(ds4n_dec_session *sess, ds4n_steer *s);

#ifdef __cplusplus
}
#endif
#endif
