/* The machine's read bandwidth as decode sees it: the pool's threads stream disjoint shares
 * of one buffer far larger than the caches, as the decode matvecs stream the weights. */
#include <stdlib.h>
#include <string.h>

#include "ds4n.h"
#include "profile.h"

struct read_job {
    const uint64_t *words;
    int64_t n_words;
    uint64_t sink[64]; /* per share, so the reads cannot be optimised away */
};

static void read_share(void *ctx, int ith, int nth) {
    struct read_job *j = ctx;
    const int64_t lines = j->n_words / 8;
    const int64_t a = lines * ith / nth * 8, b = lines * (ith + 1) / nth * 8;
    uint64_t acc[8] = {0};
    for (int64_t i = a; i < b; i += 8)
        for (int l = 0; l < 8; l++) acc[l] ^= j->words[i + l]; /* vectorised: whole lines */
    uint64_t x = 0;
    for (int l = 0; l < 8; l++) x ^= acc[l];
    j->sink[ith % 64] = x;
}

double ds4n_read_bandwidth(ds4n_pool *pool, int64_t bytes, int reps) {
    if (bytes < 4096 || reps < 1) return -1.0;
    bytes = bytes / 64 * 64;
    uint64_t *buf = aligned_alloc(64, (size_t)bytes);
    if (!buf) return -1.0;
    memset(buf, 0x5a, (size_t)bytes); /* real pages, not the shared zero page */
    struct read_job job = {buf, bytes / 8, {0}};
    double best = 0.0;
    for (int r = 0; r < reps; r++) {
        const int64_t t0 = ds4n_now_ns();
        ds4n_pool_run(pool, read_share, &job);
        const int64_t ns = ds4n_now_ns() - t0;
        if (ns > 0 && (double)bytes * 1e9 / (double)ns > best) best = (double)bytes * 1e9 / (double)ns;
    }
    free(buf);
    return best;
}
