/* Paired A/B of two builds of the kernel library on one decode matvec shape, in one process:
 * both libraries are loaded (dlopen, each its own pool), and every round times a pass over
 * the same weights with A, then with B. On a machine shared with other work the memory's
 * speed moves by 1.5-2x from one second to the next, so two separate runs (matvec_stream.py
 * --lib) compare two moments as much as two builds; a round's ratio compares them under the
 * same conditions, and the median over rounds is steady. The weights are distinct copies
 * (TOTAL_MB in all, far above the L3) on huge pages, as a model's are; time is the thread's
 * CPU time with one thread, wall time with more; medians, not bests (a VM's CPU time now and
 * then loses a slice of work to steal accounting, and the best of many runs picks those).
 * It checks that both builds give the same bytes.
 *
 *   cc -O2 -o /tmp/matvec_ab scripts/figures/matvec_ab.c -ldl
 *   /tmp/matvec_ab A/libds4n.so B/libds4n.so TYPE LIMBS THREADS ROWS K TOTAL_MB ROUNDS
 *   # e.g. 12 2 1 1536 8960 150 15: Q4_K, int2, one thread, the 1.5B's down projection
 *
 * TYPE is GGML's number (Q4_0 2, Q4_1 3, Q8_0 8, Q4_K 12, Q6_K 14); LIMBS 0 exact, 2, 3. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "figure_util.h"

typedef void *(*pool_new_fn)(int);
typedef int (*set_precision_fn)(void *, int);
typedef void (*matmul_fn)(void *, int, const void *, int64_t, int64_t, const float *, int64_t,
                          float *);
typedef int64_t (*type_fn)(int);

struct build {
    void *pool;
    matmul_fn matmul;
};

static struct build load(const char *path, int threads, int limbs) {
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "%s\n", dlerror());
        exit(1);
    }
    struct build b = {((pool_new_fn)dlsym(lib, "ds4n_pool_new"))(threads),
                      (matmul_fn)dlsym(lib, "ds4n_matmul")};
    if (((set_precision_fn)dlsym(lib, "ds4n_pool_set_precision"))(b.pool, limbs) < 0) {
        fprintf(stderr, "bad limbs %d\n", limbs);
        exit(2);
    }
    return b;
}

int main(int argc, char **argv) {
    if (argc != 10) {
        fprintf(stderr, "usage: matvec_ab A.so B.so TYPE LIMBS THREADS ROWS K TOTAL_MB ROUNDS\n");
        return 2;
    }
    const int type = atoi(argv[3]), limbs = atoi(argv[4]), threads = atoi(argv[5]);
    const int64_t rows = atoll(argv[6]), K = atoll(argv[7]), total = atoll(argv[8]) << 20;
    const int rounds = atoi(argv[9]);
    struct build a = load(argv[1], threads, limbs), b = load(argv[2], threads, limbs);
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    const int64_t block_bytes = ((type_fn)dlsym(lib, "ds4n_type_block_bytes"))(type);
    const int64_t block_size = ((type_fn)dlsym(lib, "ds4n_type_block_size"))(type);
    if (block_bytes <= 0 || K % block_size != 0 || rows < 1 || rounds < 1) {
        fprintf(stderr, "bad type, K or rows\n");
        return 2;
    }
    const int64_t bytes = rows * (K / block_size * block_bytes);
    const int copies = (int)((total + bytes - 1) / bytes) > 0 ? (int)((total + bytes - 1) / bytes) : 1;
    void **W = malloc(sizeof *W * (size_t)copies);
    for (int c = 0; c < copies; c++) W[c] = fig_weights(type, bytes, block_bytes);
    float *x = malloc(sizeof(float) * (size_t)K);
    float *ya = malloc(sizeof(float) * (size_t)rows), *yb = malloc(sizeof(float) * (size_t)rows);
    for (int64_t i = 0; i < K; i++) x[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    double *ta = malloc(sizeof(double) * (size_t)rounds), *tb = malloc(sizeof(double) * (size_t)rounds);
    double *ratio = malloc(sizeof(double) * (size_t)rounds);
    for (int r = 0; r < rounds; r++) {
        double t0 = fig_now(threads);
        for (int c = 0; c < copies; c++) a.matmul(a.pool, type, W[c], rows, K, x, 1, ya);
        ta[r] = (fig_now(threads) - t0) / copies;
        t0 = fig_now(threads);
        for (int c = 0; c < copies; c++) b.matmul(b.pool, type, W[c], rows, K, x, 1, yb);
        tb[r] = (fig_now(threads) - t0) / copies;
        ratio[r] = ta[r] / tb[r];
    }
    if (memcmp(ya, yb, sizeof(float) * (size_t)rows) != 0) printf("THE RESULTS DIFFER\n");
    const double ma = fig_median(ta, rounds), mb = fig_median(tb, rounds), mr = fig_median(ratio, rounds);
    printf("type %d limbs %d threads %d, %lld x %lld (%d copies of %.2f MB): A %.1f GB/s, "
           "B %.1f GB/s; B / A speed %.2f (quartiles %.2f .. %.2f)\n",
           type, limbs, threads, (long long)rows, (long long)K, copies, (double)bytes / 1e6,
           (double)bytes / ma / 1e9, (double)bytes / mb / 1e9, mr, ratio[rounds / 4],
           ratio[3 * rounds / 4]);
    return 0;
}
