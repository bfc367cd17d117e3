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

#endif
