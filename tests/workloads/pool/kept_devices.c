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
#define PROG "kept_devices"
#include "pool_workload.h"

int main(void) {
    stat_fn g = pool_stat_or_exit();
    cudaStream_t s0, s1;
    void *anchor, *x, *b[2];
    CHECK(cudaSetDevice(0));
    CHECK(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking));
    CHECK(cudaMalloc(&anchor, 256u << 10));
    rotating_pairs(300);
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
