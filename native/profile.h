/* Decode profile hooks (internal; the ABI is in ds4n.h). Off by default: each hook is one
 * relaxed load of a flag when profiling is off. */
#ifndef DS4N_PROFILE_H
#define DS4N_PROFILE_H

#include <stdatomic.h>
#include <stdint.h>

#define DS4N_PROF_LOG 16 /* matmul parts one thread may log per dispatch */

/* What one thread did during one pool dispatch. Written only by its thread; read by the
 * dispatching thread after the dispatch is complete. */
struct ds4n_prof_part {
    int type, prefill, count; /* count: parts of this shape merged here */
    int64_t rows, K, ns, tokens; /* tokens: the merged parts' T, summed */
};
struct ds4n_prof_log {
    int n;
    int shares;       /* shares this thread ran in the dispatch */
    int64_t share_ns; /* time in the dispatched function */
    int64_t first_ns; /* when its first share started (ds4n_now_ns) */
    struct ds4n_prof_part part[DS4N_PROF_LOG];
};

extern atomic_int ds4n_profiling;
static inline int ds4n_profile_on(void) {
    return atomic_load_explicit(&ds4n_profiling, memory_order_relaxed);
}

int64_t ds4n_now_ns(void);
/* The calling thread's log (NULL: not a pool thread, nothing is logged). */
void ds4n_profile_set_log(struct ds4n_prof_log *log);
struct ds4n_prof_log *ds4n_profile_log(void);
/* A matmul part of ns nanoseconds ran on this thread (every share of a matmul reports one,
 * empty or not, so a dispatch of nth shares holds nth parts per matmul). */
void ds4n_profile_matmul(int type, int64_t rows, int64_t K, int64_t T, int64_t ns);
/* A dispatch ran from t0 to t1 (caller's clock); folds and clears the threads' logs. */
void ds4n_profile_dispatch(struct ds4n_prof_log *logs, int n_logs, int64_t t0, int64_t t1);

#endif
