/* Decode profile: where the time of a forward pass goes, measured inside the library.
 *
 * Every pool dispatch is timed on the dispatching thread (wall), and each thread times the
 * work it ran in it (busy) and, within that, each matmul part by (type, rows, K). The busiest
 * thread's time (the dispatch's critical path) is divided among its matmuls and its other work
 * (attention) in proportion to their busy time; the rest of the wall time is the dispatch's
 * synchronisation (publishing the job, workers waking up, the final barrier), so the parts
 * add up to the dispatch wall exactly, whatever the thread count or the machine's load. Each
 * worker's start is also timed against the dispatch's: how late it joined, or that it ran no
 * share at all (asleep or descheduled, its share taken by another thread). Time between dispatches of one forward pass (norms, RoPE,
 * KV writes, ...) is the span from the first dispatch's start to the last one's end, less
 * the dispatches; ds4n_profile_mark() closes one forward pass. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ds4n.h"
#include "profile.h"

#define MAX_ENTRIES 64

atomic_int ds4n_profiling;

static ds4n_profile_entry entries[MAX_ENTRIES];
static int n_entries;
static int64_t token_parts[MAX_ENTRIES]; /* the entries' T summed over every share */
static int64_t dispatches, wall_ns, busy_ns, other_wall_ns, other_busy_ns, span_ns, passes;
static int64_t sync_ns, join_ns, joins, absent;
static int64_t first_start, last_end; /* of the open forward pass; first_start 0: none */
static _Thread_local struct ds4n_prof_log *tls_log;

int64_t ds4n_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void ds4n_profile_set_log(struct ds4n_prof_log *log) { tls_log = log; }
struct ds4n_prof_log *ds4n_profile_log(void) { return tls_log; }

void ds4n_profile_matmul(int type, int64_t rows, int64_t K, int64_t T, int64_t ns) {
    struct ds4n_prof_log *log = tls_log;
    if (!log) return;
    int prefill = T > 1;
    for (int i = 0; i < log->n; i++)
        if (log->part[i].type == type && log->part[i].rows == rows && log->part[i].K == K &&
            log->part[i].prefill == prefill) {
            log->part[i].ns += ns;
            log->part[i].tokens += T;
            log->part[i].count++;
            return;
        }
    if (log->n == DS4N_PROF_LOG) return; /* counted as other work of the dispatch */
    log->part[log->n].type = type;
    log->part[log->n].prefill = prefill;
    log->part[log->n].rows = rows;
    log->part[log->n].K = K;
    log->part[log->n].ns = ns;
    log->part[log->n].tokens = T;
    log->part[log->n].count = 1;
    log->n++;
}

static ds4n_profile_entry *entry(int type, int prefill, int64_t rows, int64_t K) {
    for (int i = 0; i < n_entries; i++)
        if (entries[i].type == type && entries[i].prefill == prefill && entries[i].rows == rows &&
            entries[i].K == K)
            return &entries[i];
    if (n_entries == MAX_ENTRIES) return NULL;
    ds4n_profile_entry *e = &entries[n_entries++];
    memset(e, 0, sizeof *e);
    token_parts[e - entries] = 0;
    e->type = type, e->prefill = prefill, e->rows = rows, e->K = K;
    return e;
}

void ds4n_profile_dispatch(struct ds4n_prof_log *logs, int n_logs, int64_t t0, int64_t t1) {
    const int64_t wall = t1 - t0;
    int64_t busy = 0, mm_busy = 0, crit = 0;
    for (int t = 0; t < n_logs; t++) {
        busy += logs[t].share_ns;
        if (logs[t].share_ns > crit) crit = logs[t].share_ns;
        for (int i = 0; i < logs[t].n; i++) mm_busy += logs[t].part[i].ns;
        if (t == 0) continue; /* the caller: not woken */
        if (logs[t].shares == 0) {
            absent++;
        } else {
            joins++;
            join_ns += logs[t].first_ns > t0 ? logs[t].first_ns - t0 : 0;
        }
    }
    if (crit > wall) crit = wall; /* clock granularity */
    dispatches++;
    wall_ns += wall;
    busy_ns += busy;
    if (busy > 0) sync_ns += wall - crit;
    const double per_busy = busy > 0 ? (double)crit / (double)busy : 0.0;
    /* A matmul is n_logs parts (one per share), wherever the shares ran. */
    for (int t = 0; t < n_logs; t++)
        for (int i = 0; i < logs[t].n; i++) {
            const struct ds4n_prof_part *p = &logs[t].part[i];
            ds4n_profile_entry *e = entry(p->type, p->prefill, p->rows, p->K);
            if (!e) continue;
            e->parts += p->count;
            e->calls = e->parts / n_logs;
            token_parts[e - entries] += p->tokens;
            e->tokens = token_parts[e - entries] / n_logs;
            e->busy_ns += p->ns;
            e->wall_ns += (int64_t)((double)p->ns * per_busy);
        }
    other_busy_ns += busy - mm_busy;
    other_wall_ns += (int64_t)((double)(busy - mm_busy) * per_busy);
    if (busy == 0) other_wall_ns += wall; /* too short to time: not a matmul's */
    for (int t = 0; t < n_logs; t++) logs[t].n = 0, logs[t].shares = 0, logs[t].share_ns = 0;
    if (first_start == 0) first_start = t0;
    last_end = t1;
}

void ds4n_profile_mark(void) {
    if (first_start != 0) {
        span_ns += last_end - first_start;
        passes++;
    }
    first_start = 0;
}

void ds4n_profile_enable(int on) {
    n_entries = 0;
    dispatches = wall_ns = busy_ns = other_wall_ns = other_busy_ns = span_ns = passes = 0;
    sync_ns = join_ns = joins = absent = 0;
    first_start = last_end = 0;
    atomic_store(&ds4n_profiling, on ? 1 : 0);
}

int ds4n_profile_read(ds4n_profile_entry *out, int max, int64_t *totals) {
    int n = n_entries < max ? n_entries : max;
    if (n > 0) memcpy(out, entries, sizeof *out * (size_t)n);
    const int64_t t[DS4N_PROFILE_TOTALS] = {dispatches, wall_ns,  busy_ns, other_wall_ns,
                                            other_busy_ns, span_ns,  passes, sync_ns,
                                            join_ns,    joins,    absent};
    memcpy(totals, t, sizeof t);
    return n_entries;
}
