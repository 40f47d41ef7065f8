/*
 * round_end - a tight pool's round that ends at the first free a thread cache keeps.
 *
 *   round_end
 *
 * A 256 KiB block (cudaMalloc) live while 300 cudaMalloc + cudaFree pairs of 8 sizes in
 * rotation (1..8 MiB) run (none kept by a thread cache: cudaFree'd blocks reach the pool;
 * nothing live is never reached, so no round ends), then one block of 3 MiB + 512 B
 * allocated with cudaMallocAsync on a stream, the 256 KiB block freed with cudaFree, the new
 * one freed with cudaFreeAsync on its stream (the first free a thread cache keeps, while
 * nothing else is live: the pool's round may end there), then the same size again on the
 * same stream. Prints the pool's statistics after that allocation:
 * "round_end allocs=.. frees=.. cache_hits=.. cached=.. live=.. reserved=.. syncs=..", or
 * "round_end: no library" without libvramshim.so. Exit 0, or 2 on a CUDA error.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda_api.h"

typedef long long (*stat_fn)(int, const char *);

#define CHECK(x)                                                                          \
    do {                                                                                  \
        cudaError_t e_ = (x);                                                             \
        if (e_ != cudaSuccess) {                                                          \
            fprintf(stderr, "round_end: %s failed: %d (line %d)\n", #x, (int)e_, __LINE__); \
            exit(2);                                                                      \
        }                                                                                 \
    } while (0)

int main(void) {
    stat_fn g = (stat_fn)dlsym(RTLD_DEFAULT, "vramshim_pool_stat");
    if (!g) {
        printf("round_end: no library\n");
        return 0;
    }
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    void *p, *anchor;
    CHECK(cudaMalloc(&anchor, 256u << 10));
    for (int i = 0; i < 300; i++) {
        CHECK(cudaMalloc(&p, (size_t)(1 + i % 8) << 20));
        CHECK(cudaFree(p));
    }
    size_t x = (3u << 20) + 512;
    CHECK(cudaMallocAsync(&p, x, s));
    CHECK(cudaFree(anchor));
    CHECK(cudaFreeAsync(p, s));
    CHECK(cudaMallocAsync(&p, x, s));
    printf("round_end allocs=%lld frees=%lld cache_hits=%lld cached=%lld live=%lld reserved=%lld "
           "syncs=%lld\n",
           g(0, "allocs"), g(0, "frees"), g(0, "cache_hits"), g(0, "cached"), g(0, "live"),
           g(0, "reserved"), g(0, "syncs"));
    CHECK(cudaFreeAsync(p, s));
    CHECK(cudaStreamSynchronize(s));
    return 0;
}
