/*
 * kept_devices - a thread cache holding blocks of two devices, and one device's round watch.
 *
 *   kept_devices
 *
 * Device 0: a 256 KiB block (cudaMalloc) live while 300 cudaMalloc + cudaFree pairs of 8 sizes
 * run (its pool's round may end from then on once nothing else is live), then a 1 MiB block
 * allocated with cudaMallocAsync on a stream of device 0. Device 1: two 4 MiB blocks
 * allocated and freed with cudaMallocAsync / cudaFreeAsync on a stream of device 1 (kept by
 * the thread's cache). Device 0 again: the 1 MiB block freed with cudaFreeAsync (kept too):
 * device 0 still has the 256 KiB block live, so its round cannot end, whatever the cache
 * keeps of device 1. Prints "kept_devices frees0=.. frees1=.." (the frees each device's pool
 * has seen), or "kept_devices: no library". Exit 0, or 2 on a CUDA error.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda_api.h"

typedef long long (*stat_fn)(int, const char *);

#define CHECK(x)                                                                             \
    do {                                                                                     \
        cudaError_t e_ = (x);                                                                \
        if (e_ != cudaSuccess) {                                                             \
            fprintf(stderr, "kept_devices: %s failed: %d (line %d)\n", #x, (int)e_, __LINE__); \
            exit(2);                                                                         \
        }                                                                                    \
    } while (0)

int main(void) {
    stat_fn g = (stat_fn)dlsym(RTLD_DEFAULT, "vramshim_pool_stat");
    if (!g) {
        printf("kept_devices: no library\n");
        return 0;
    }
    cudaStream_t s0, s1;
    void *anchor, *p, *x, *b[2];
    CHECK(cudaSetDevice(0));
    CHECK(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking));
    CHECK(cudaMalloc(&anchor, 256u << 10));
    for (int i = 0; i < 300; i++) {
        CHECK(cudaMalloc(&p, (size_t)(1 + i % 8) << 20));
        CHECK(cudaFree(p));
    }
    CHECK(cudaMallocAsync(&x, 1u << 20, s0));
    CHECK(cudaSetDevice(1));
    CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    for (int i = 0; i < 2; i++) CHECK(cudaMallocAsync(&b[i], 4u << 20, s1));
    for (int i = 0; i < 2; i++) CHECK(cudaFreeAsync(b[i], s1));
    CHECK(cudaSetDevice(0));
    CHECK(cudaFreeAsync(x, s0));
    printf("kept_devices frees0=%lld frees1=%lld\n", g(0, "frees"), g(1, "frees"));
    CHECK(cudaFree(anchor));
    CHECK(cudaDeviceSynchronize());
    return 0;
}
