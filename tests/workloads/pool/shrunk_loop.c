/*
 * shrunk_loop - a program whose use shrinks for good to one stream-ordered pair that the
 * thread's cache serves whole.
 *
 *   shrunk_loop
 *
 * 64 blocks of 1 MiB allocated and freed with cudaMallocAsync / cudaFreeAsync on a stream (a
 * 64 MiB peak), a 4 KiB block allocated there and kept live (nothing live is never reached),
 * then 3 x 65536 pairs of 8 KiB on the same stream (the budget's window is 65536
 * allocations), with cudaDeviceSynchronize after every 1000th. Prints the pool's statistics
 * then: "shrunk_loop reserved=.. releases=..", or "shrunk_loop: no library" without
 * libvramshim.so. Exit 0, or 2 on a CUDA error.
 */
#define PROG "shrunk_loop"
#include "pool_workload.h"

int main(void) {
    stat_fn g = pool_stat_or_exit();
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    void *big[64], *anchor, *p;
    for (int i = 0; i < 64; i++)
        CHECK(cudaMallocAsync(&big[i], 1u << 20, s));
    for (int i = 0; i < 64; i++)
        CHECK(cudaFreeAsync(big[i], s));
    CHECK(cudaMallocAsync(&anchor, 4096, s));
    for (long i = 1; i <= 3 * 65536L; i++) {
        CHECK(cudaMallocAsync(&p, 8192, s));
        CHECK(cudaFreeAsync(p, s));
        if (i % 1000 == 0)
            CHECK(cudaDeviceSynchronize());
    }
    printf("shrunk_loop reserved=%lld releases=%lld\n", g(0, "reserved"), g(0, "releases"));
    CHECK(cudaFreeAsync(anchor, s));
    CHECK(cudaStreamSynchronize(s));
    return 0;
}
