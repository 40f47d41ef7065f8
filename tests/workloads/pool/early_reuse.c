/*
 * early_reuse - a block freed while a delayed stream "kernel" still writes into it must not be
 * handed out before that kernel is done (cuda-sim runs vramsimKernelFill on the stream's worker
 * after its delay, so a too-early reuse really lets the late write land in the new block).
 *
 *   early_reuse MODE ROUNDS [anchor]
 *
 * MODE: async - cudaMallocAsync(s1) + cudaFreeAsync(s1); the next block is cudaMallocAsync(s2)
 *       sync  - cudaMalloc + cudaFree; the next block is cudaMalloc
 * Each round, for several sizes (sub-page, page, multi-page with tails): allocate A, enqueue a
 * fill of A with 0xAA delayed by 30 ms on s1, free A (as MODE says), allocate B (same size),
 * fill B with 0x55 on s2 (no delay), synchronize everything, read B back: any byte that is not
 * 0x55 is a foreign byte (the late write into A landed in B). With "anchor", a 4 KiB block
 * stays allocated throughout, so a freed block is never all a pool has live (a tight pool's
 * round end).
 * Output: one line "early_reuse: mode=M blocks=N same_address=N foreign=N" (same_address:
 * blocks that got A's address back). Exit 1 if foreign > 0, 2 on a CUDA error.
 */
#include <string.h>

#define PROG "early_reuse"
#include "pool_workload.h"

int main(int argc, char **argv) {
    if (argc < 3 || (argc > 3 && strcmp(argv[3], "anchor") != 0)) {
        fprintf(stderr, "usage: early_reuse async|sync ROUNDS [anchor]\n");
        return 2;
    }
    int async = strcmp(argv[1], "async") == 0;
    int rounds = atoi(argv[2]);
    size_t sizes[] = {64 << 10, 2 << 20, (3 << 20) + 4096, 9 << 20};
    int nsizes = sizeof sizes / sizeof sizes[0];
    cudaStream_t s1, s2;
    CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    void *anchor = NULL;
    if (argc > 3) CHECK(cudaMalloc(&anchor, 4096));
    unsigned char *host = malloc(9 << 20);
    long blocks = 0, same = 0, foreign = 0;
    for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < nsizes; i++) {
            size_t n = sizes[i];
            void *a = NULL, *b = NULL;
            if (async)
                CHECK(cudaMallocAsync(&a, n, s1));
            else
                CHECK(cudaMalloc(&a, n));
            CHECK(vramsimKernelFill(a, 0xAA, n, 30000, s1));
            if (async)
                CHECK(cudaFreeAsync(a, s1));
            else
                CHECK(cudaFree(a));
            if (async)
                CHECK(cudaMallocAsync(&b, n, s2));
            else
                CHECK(cudaMalloc(&b, n));
            foreign += foreign_bytes(b, n, s2, host);
            blocks++;
            same += a == b;
            if (async)
                CHECK(cudaFreeAsync(b, s2));
            else
                CHECK(cudaFree(b));
            CHECK(cudaDeviceSynchronize());
        }
    }
    if (anchor) CHECK(cudaFree(anchor));
    printf("early_reuse: mode=%s blocks=%ld same_address=%ld foreign=%ld\n", argv[1], blocks, same, foreign);
    return foreign > 0 ? 1 : 0;
}
