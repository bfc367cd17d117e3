/* The machine's read bandwidth as decode sees it: the pool's threads stream disjoint shares
 * of one buffer, as the decode matvecs stream the weights.
 *
 * Two things measured on the 2-core KVM development machine decide the figure, so both are
 * the caller's to choose or fixed here: the page size (a 96 MB buffer read at 18-42 GB/s on
 * 2 MB huge pages against 9-27 GB/s on 4 KB pages: every 4 KB page is a TLB miss, a
 * two-level walk under a hypervisor), and the number of sequential streams each thread
 * reads at once (one stream left half the bandwidth idle; the figure levels off at about
 * eight, which this measure reads). The buffer's size matters too (a model that fits the
 * last-level cache streams faster than one that does not): the caller passes the bytes a
 * decode step reads. */
#include <stdlib.h>
#include <string.h>
#ifdef __linux__
#include <sys/mman.h>
#endif

#include "ds4n.h"
#include "profile.h"

#define STREAMS 8 /* sequential streams per thread */
#define HUGE_PAGE (2 << 20)

struct read_job {
    const uint64_t *words;
    int64_t n_words;
    uint64_t sink[64]; /* per share, so the reads cannot be optimised away */
};

static void read_share(void *ctx, int ith, int nth) {
    struct read_job *j = ctx;
    const int64_t lines = j->n_words / 8;
    const int64_t a = lines * ith / nth, b = lines * (ith + 1) / nth;
    const int64_t run = (b - a) / STREAMS; /* lines per stream; the rest read after */
    uint64_t acc[8] = {0};
    for (int64_t i = 0; i < run; i++)
        for (int s = 0; s < STREAMS; s++) {
            const uint64_t *line = j->words + (a + s * run + i) * 8;
            for (int l = 0; l < 8; l++) acc[l] ^= line[l]; /* vectorised: whole lines */
        }
    for (int64_t i = a + STREAMS * run; i < b; i++)
        for (int l = 0; l < 8; l++) acc[l] ^= j->words[i * 8 + l];
    uint64_t x = 0;
    for (int l = 0; l < 8; l++) x ^= acc[l];
    j->sink[ith % 64] = x;
}

/* A buffer of `bytes` (a multiple of 64), on huge pages if asked and the OS has them;
 * *map_bytes is set when it must be released with munmap (else free). */
static uint64_t *buffer(int64_t bytes, int huge_pages, size_t *map_bytes) {
    *map_bytes = 0;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (huge_pages) {
        const size_t n = (size_t)bytes + HUGE_PAGE;
        char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) return NULL;
        /* mmap aligns to 4 KB: start on a 2 MB boundary so every page can be huge. */
        char *start = p + (HUGE_PAGE - (uintptr_t)p % HUGE_PAGE) % HUGE_PAGE;
        if (start != p) munmap(p, (size_t)(start - p));
        *map_bytes = n - (size_t)(start - p);
        madvise(start, (size_t)bytes, MADV_HUGEPAGE); /* advice: 4 KB pages if refused */
        return (uint64_t *)start;
    }
#else
    (void)huge_pages;
#endif
    return aligned_alloc(64, (size_t)bytes);
}

double ds4n_read_bandwidth(ds4n_pool *pool, int64_t bytes, int reps, int huge_pages) {
    if (bytes < 4096 || reps < 1) return -1.0;
    bytes = bytes / 64 * 64;
    size_t map_bytes;
    uint64_t *buf = buffer(bytes, huge_pages, &map_bytes);
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
#ifdef __linux__
    if (map_bytes) {
        munmap(buf, map_bytes);
        return best;
    }
#endif
    free(buf);
    return best;
}
