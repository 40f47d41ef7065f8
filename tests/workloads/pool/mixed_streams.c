/*
 * mixed_streams - what the pool keys by stream, from every side: blocks allocated with
 * cudaMalloc (any stream) and freed with cudaFreeAsync on the legacy default stream (handle
 * 0), blocks allocated with cudaMallocAsync on cudaStreamLegacy (handle 0's stream under
 * another name) and freed on handle 0, and blocks allocated and freed on cudaStreamPerThread
 * and through the _ptsz entry points on handle 0 (the thread's own default stream, one
 * stream under two names).
 *
 *   mixed_streams ROUNDS
 *
 * Each round: for sizes of 1..8 MiB (and 512 B over), one block of each kind, freed before
 * the next. Prints "mixed_streams syncs=S mappings=M" (the pool's statistics) or
 * "mixed_streams: no library". No device synchronization. Exit 0, or 2 on a CUDA error.
 */
#define PROG "mixed_streams"
#include "pool_workload.h"

int main(int argc, char **argv) {
    stat_fn g = pool_stat_or_exit();
    long rounds = argc > 1 ? atol(argv[1]) : 0;
    if (argc != 2 || rounds < 1) {
        fprintf(stderr, "usage: mixed_streams ROUNDS\n");
        return 2;
    }
    void *p;
    for (long r = 0; r < rounds; r++) {
        for (int i = 0; i < 8; i++) {
            size_t size = ((size_t)(1 + i) << 20) + 512 * (size_t)(r % 2);
            CHECK(cudaMalloc(&p, size));
            CHECK(cudaFreeAsync(p, 0));
            CHECK(cudaMallocAsync(&p, size, cudaStreamLegacy));
            CHECK(cudaFreeAsync(p, 0));
            CHECK(cudaMallocAsync(&p, size, cudaStreamPerThread));
            CHECK(cudaFreeAsync_ptsz(p, 0));
            CHECK(cudaMallocAsync_ptsz(&p, size, 0));
            CHECK(cudaFreeAsync(p, cudaStreamPerThread));
        }
    }
    printf("mixed_streams syncs=%lld mappings=%lld\n", g(0, "syncs"), g(0, "mappings"));
    return 0;
}
