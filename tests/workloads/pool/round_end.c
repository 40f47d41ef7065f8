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
#define PROG "round_end"
#include "pool_workload.h"

int main(void) {
    stat_fn g = pool_stat_or_exit();
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    void *p, *anchor;
    CHECK(cudaMalloc(&anchor, 256u << 10));
    rotating_pairs(300);
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
