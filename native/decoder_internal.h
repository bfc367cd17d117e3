/* What the decoder's own files share (decoder_attention.c plans the attention, and
 * decoder_session.c sizes its workspace, by these); nothing else includes it. */
#ifndef DS4N_DECODER_INTERNAL_H
#define DS4N_DECODER_INTERNAL_H

/* Attention jobs hold ~48 query rows: enough reuse of each K/V load, small enough to
 * balance across threads. */
#define QROWS 48
/* Split-key plans never exceed this many jobs per thread (see plan_attention). */
#define MAX_SPLIT_ITEMS_PER_THREAD 12
/* Attention units of one call at most: every row of DS4N_DEC_MAX_SEQ sequences of decode
 * rows (decoder.h), each its own unit (see ds4n_attention). */
#define DS4N_DEC_MAX_UNITS (DS4N_DEC_MAX_SEQ * DS4N_DEC_SMALL_T)

#endif
