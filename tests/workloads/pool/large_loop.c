/*
 * large_loop - a loop of one large stream-ordered size, then layers of two sizes.
 *
 *   large_loop
 *
 * On one stream (cudaMallocAsync / cudaFreeAsync): a 4 KiB block allocated and kept live (no
 * round of a tight pool ends), then 125 times four blocks of 8 MiB allocated and freed (a loop
 * of one large size, longer than any period the pool's layer replay looks for), then 12 layers:
 * a 6 MiB and an 8 MiB block allocated, the layer before's 8 MiB block and this layer's 6 MiB
 * block freed. Prints the pool's statistics after the loop and at the end:
 * "large_loop loop allocs=.. frees=.. cache_hits=.. reserved=.. peak_reserved=.. mappings=.."
 * and "large_loop end ..." (the same fields), or "large_loop: no library" without
 * libvramshim.so. Exit 0, or 2 on a CUDA error.
 */
#define PROG "large_loop"
#include "pool_workload.h"

static void print_stats(stat_fn g, const char *when) {
    printf("large_loop %s allocs=%lld frees=%lld cache_hits=%lld reserved=%lld peak_reserved=%lld mappings=%lld\n",
           when, g(0, "allocs"), g(0, "frees"), g(0, "cache_hits"), g(0, "reserved"),
           g(0, "peak_reserved"), g(0, "mappings"));
}

int main(void) {
    stat_fn g = pool_stat_or_exit();
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    void *anchor, *four[4];
    CHECK(cudaMallocAsync(&anchor, 4096, s));
    for (int i = 0; i < 125; i++) {
        for (int k = 0; k < 4; k++)
            CHECK(cudaMallocAsync(&four[k], 8u << 20, s));
        for (int k = 0; k < 4; k++)
            CHECK(cudaFreeAsync(four[k], s));
    }
    print_stats(g, "loop");
    void *prev = NULL;
    for (int i = 0; i < 12; i++) {
        void *a, *b;
        CHECK(cudaMallocAsync(&a, 6u << 20, s));
        CHECK(cudaMallocAsync(&b, 8u << 20, s));
        if (prev) CHECK(cudaFreeAsync(prev, s));
        CHECK(cudaFreeAsync(a, s));
        prev = b;
    }
    print_stats(g, "end");
    CHECK(cudaFreeAsync(prev, s));
    CHECK(cudaFreeAsync(anchor, s));
    CHECK(cudaStreamSynchronize(s));
    return 0;
}
