/*
 * pool_workload.h - what the pool's C workloads share. Define PROG (the program's name, which
 * starts every line it prints) before including it.
 *
 *   CHECK(call)          a runtime call that must succeed: otherwise one line on stderr
 *                        ("PROG: call failed: CODE (line N)") and exit 2
 *   pool_stat_or_exit()  the preloaded library's vramshim_pool_stat; without the library,
 *                        "PROG: no library" on stdout and exit 0
 *   rotating_pairs(n)    n cudaMalloc + cudaFree pairs of 1..8 MiB in rotation (cudaFree'd:
 *                        no thread cache keeps them, every free reaches the pool)
 *   foreign_bytes(b, n, s, host)
 *                        fills block b (n bytes) with 0x55 on stream s (no delay), synchronizes
 *                        s and the device, reads b back into host (n bytes at least) and returns
 *                        how many bytes are not 0x55: those a late write into a block freed
 *                        earlier put there (the pool handed its bytes out too early)
 */
#ifndef VRAMSHIM_POOL_WORKLOAD_H
#define VRAMSHIM_POOL_WORKLOAD_H

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda_api.h"

#ifndef PROG
#error "define PROG, the program's name, before including pool_workload.h"
#endif

#define CHECK(x)                                                                           \
    do {                                                                                   \
        cudaError_t e_ = (x);                                                              \
        if (e_ != cudaSuccess) {                                                           \
            fprintf(stderr, PROG ": %s failed: %d (line %d)\n", #x, (int)e_, __LINE__);     \
            exit(2);                                                                       \
        }                                                                                  \
    } while (0)

/* vramshim_pool_stat(device, field): one of the pool's statistics, -1 for an unknown one. */
typedef long long (*stat_fn)(int, const char *);

static inline stat_fn pool_stat_or_exit(void) {
    stat_fn g = (stat_fn)dlsym(RTLD_DEFAULT, "vramshim_pool_stat");
    if (!g) {
        printf(PROG ": no library\n");
        exit(0);
    }
    return g;
}

static inline void rotating_pairs(int n) {
    void *p;
    for (int i = 0; i < n; i++) {
        CHECK(cudaMalloc(&p, (size_t)(1 + i % 8) << 20));
        CHECK(cudaFree(p));
    }
}

static inline long foreign_bytes(void *b, size_t n, cudaStream_t s, unsigned char *host) {
    CHECK(vramsimKernelFill(b, 0x55, n, 0, s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(host, b, n, cudaMemcpyDeviceToHost));
    long bad = 0;
    for (size_t k = 0; k < n; k++)
        bad += host[k] != 0x55;
    return bad;
}

#endif
