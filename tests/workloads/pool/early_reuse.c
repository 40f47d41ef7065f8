/*
 * early_reuse - a block freed while a delayed stream "kernel" still writes into it must not be
 * handed out before that kernel is done (cuda-sim runs vramsimKernelFill on the stream's worker
 * after its delay, so a too-early reuse really lets the late write land in the new block).
 *
 *   early_reuse MODE ROUNDS [anchor] [loop]
 *
 * MODE: async - cudaMallocAsync(s1) + cudaFreeAsync(s1); the next block is cudaMallocAsync(s2)
 *       sync  - cudaMalloc + cudaFree; the next block is cudaMalloc
 * Each round, for several sizes (sub-page, page, multi-page with tails): allocate A, enqueue a
 * fill of A with 0xAA delayed by 30 ms on s1, free A (as MODE says), allocate B (same size),
 * fill B with 0x55 on s2 (no delay), synchronize everything, read B back: any byte that is not
 * 0x55 is a foreign byte (the late write into A landed in B). With "anchor", a 4 KiB block
 * stays allocated throughout, so a freed block is never all a pool has live (a tight pool's
 * round end). With "loop" (async only), only the sizes of a page or more, each A on s1 after a
 * loop of 100 pairs of its size on s1: a run of one large size that a tight pool's layer replay
 * has no period for, whose frees the thread caches keep.
 * Output: one line "early_reuse: mode=M blocks=N same_address=N foreign=N" (same_address:
 * blocks that got A's address back). Exit 1 if foreign > 0, 2 on a CUDA error.
 */
#include <string.h>

#define PROG "early_reuse"
#include "pool_workload.h"

int main(int argc, char **argv) {
    int with_anchor = 0, loop = 0, bad = argc < 3;
    for (int i = 3; i < argc; i++) {
        if (strcmp(argv[i], "anchor") == 0)
            with_anchor = 1;
        else if (strcmp(argv[i], "loop") == 0)
            loop = 1;
        else
            bad = 1;
    }
    int async = !bad && strcmp(argv[1], "async") == 0;
    if (bad || (loop && !async)) {
        fprintf(stderr, "usage: early_reuse async|sync ROUNDS [anchor] [loop] (loop: async only)\n");
        return 2;
    }
    int rounds = atoi(argv[2]);
    size_t all_sizes[] = {64 << 10, 2 << 20, (3 << 20) + 4096, 9 << 20};
    /* with the loop, the sizes of a page or more */
    size_t *sizes = all_sizes + loop;
    int nsizes = (int)(sizeof all_sizes / sizeof all_sizes[0]) - loop;
    cudaStream_t s1, s2;
    CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    void *anchor = NULL;
    if (with_anchor) CHECK(cudaMalloc(&anchor, 4096));
    unsigned char *host = malloc(9 << 20);
    long blocks = 0, same = 0, foreign = 0;
    for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < nsizes; i++) {
            size_t n = sizes[i];
            void *a = NULL, *b = NULL;
            for (int k = 0; loop && k < 100; k++) {
                CHECK(cudaMallocAsync(&a, n, s1));
                CHECK(cudaFreeAsync(a, s1));
            }
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
