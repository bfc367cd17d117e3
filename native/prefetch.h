/* Software prefetch of a byte range, one request per 64-byte line, for the decode paths
 * whose streams are too short for the hardware prefetchers to get ahead of (portable:
 * the compiler's builtin, a no-op where the target has no prefetch instruction). */
#ifndef DS4N_PREFETCH_H
#define DS4N_PREFETCH_H

#include <stdint.h>

/* Always inlined: a prefetch has no side effect the compiler must keep, so GCC treats an
 * out-of-line helper made only of prefetches as a call with no effect and drops it (seen:
 * every attention prefetch gone, decode at 4096 back to its speed without them). */
#define DS4N_PREFETCH_FN static inline __attribute__((always_inline)) void

/* Into L1 (locality 3). */
DS4N_PREFETCH_FN ds4n_prefetch_l1(const void *p, int64_t bytes) {
    for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch((const char *)p + o, 0, 3);
}

/* Into L2 (locality 2). */
DS4N_PREFETCH_FN ds4n_prefetch_l2(const void *p, int64_t bytes) {
    for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch((const char *)p + o, 0, 2);
}

/* A decode rows kernel's lead within each of its row streams: before a block of every row
 * is decoded, the block that far ahead in the same stream is requested (a stream is a run of
 * consecutive rows, so "ahead" runs on into the next rows). With two cores streaming, the
 * hardware prefetchers alone left the AVX-512 kernels waiting on memory (Zen 4: 1.03-1.49x
 * with it on two threads, about 1.0x on one; docs/benchmarks-real-sizes.md, "Decode at the
 * bound on Zen 4"). 0: none. Addresses past the matrix are harmless: a prefetch never
 * faults. */
#ifndef DS4N_STREAM_AHEAD
#define DS4N_STREAM_AHEAD 1024
#endif
DS4N_PREFETCH_FN ds4n_prefetch_ahead(const void *block, int64_t bytes) {
    if (DS4N_STREAM_AHEAD > 0) ds4n_prefetch_l1((const char *)block + DS4N_STREAM_AHEAD, bytes);
}

#endif
