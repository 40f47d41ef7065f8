/*
 * stream_retire - a block freed stream-ordered on a stream that is then destroyed while a
 * delayed "kernel" still writes into it must not be handed to a stream created afterwards
 * that got the same handle value (cuda-sim reuses a destroyed stream's handle for the next
 * stream created, as a driver reuses a freed object's address) before that kernel is done.
 *
 *   stream_retire runtime|driver|lookup ROUNDS [anchor]
 *
 * Each round, for several sizes (sub-page, page, multi-page with tails): create stream S,
 * allocate A on S (cudaMallocAsync), enqueue a fill of A with 0xAA delayed by 30 ms on S,
 * cudaFreeAsync(A, S), destroy S (runtime: cudaStreamDestroy; driver: cuStreamDestroy_v2
 * from dlsym; lookup: cuStreamDestroy through cudaGetDriverEntryPoint), create stream S2,
 * allocate B (same size) on S2, fill B with 0x55 on S2 (no delay), synchronize everything,
 * read B back: any byte that is not 0x55 is a foreign byte (the late write into A landed in
 * B). With "anchor", a 4 KiB block stays allocated throughout (a freed block is then never
 * all a tight pool has live, and the thread caches keep the frees).
 * Output: one line "stream_retire: mode=M blocks=N same_handle=N same_address=N foreign=N"
 * (same_handle: rounds whose S2 got S's handle value; same_address: blocks that got A's
 * address back). Exit 1 if foreign > 0, 2 on a CUDA error.
 */
#include <string.h>

#define PROG "stream_retire"
#include "pool_workload.h"

typedef CUresult (*destroy_fn)(CUstream);

int main(int argc, char **argv) {
    if (argc < 3 || (argc > 3 && strcmp(argv[3], "anchor") != 0)) {
        fprintf(stderr, "usage: stream_retire runtime|driver|lookup ROUNDS [anchor]\n");
        return 2;
    }
    const char *mode = argv[1];
    destroy_fn destroy = NULL;
    if (strcmp(mode, "driver") == 0) {
        void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
        if (lib) destroy = (destroy_fn)dlsym(lib, "cuStreamDestroy_v2");
        if (!destroy) {
            fprintf(stderr, PROG ": no cuStreamDestroy_v2\n");
            return 2;
        }
    } else if (strcmp(mode, "lookup") == 0) {
        cudaDriverEntryPointQueryResult st;
        CHECK(cudaGetDriverEntryPoint("cuStreamDestroy", (void **)&destroy, cudaEnableDefault, &st));
        if (!destroy) {
            fprintf(stderr, PROG ": no cuStreamDestroy entry point\n");
            return 2;
        }
    } else if (strcmp(mode, "runtime") != 0) {
        fprintf(stderr, "usage: stream_retire runtime|driver|lookup ROUNDS [anchor]\n");
        return 2;
    }
    int rounds = atoi(argv[2]);
    size_t sizes[] = {64 << 10, 2 << 20, (3 << 20) + 4096, 9 << 20};
    int nsizes = sizeof sizes / sizeof sizes[0];
    void *anchor = NULL;
    if (argc > 3) CHECK(cudaMalloc(&anchor, 4096));
    unsigned char *host = malloc(9 << 20);
    long blocks = 0, same_handle = 0, same = 0, foreign = 0;
    for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < nsizes; i++) {
            size_t n = sizes[i];
            cudaStream_t s, s2;
            void *a = NULL, *b = NULL;
            CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
            CHECK(cudaMallocAsync(&a, n, s));
            CHECK(vramsimKernelFill(a, 0xAA, n, 30000, s));
            CHECK(cudaFreeAsync(a, s));
            if (destroy) {
                CUresult rc = destroy((CUstream)s);
                if (rc != CUDA_SUCCESS) {
                    fprintf(stderr, PROG ": cuStreamDestroy failed: %d\n", (int)rc);
                    return 2;
                }
            } else {
                CHECK(cudaStreamDestroy(s));
            }
            CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
            same_handle += s2 == s;
            CHECK(cudaMallocAsync(&b, n, s2));
            foreign += foreign_bytes(b, n, s2, host);
            blocks++;
            same += a == b;
            CHECK(cudaFreeAsync(b, s2));
            CHECK(cudaStreamDestroy(s2));
            CHECK(cudaDeviceSynchronize());
        }
    }
    if (anchor) CHECK(cudaFree(anchor));
    printf(PROG ": mode=%s blocks=%ld same_handle=%ld same_address=%ld foreign=%ld\n", mode, blocks,
           same_handle, same, foreign);
    return foreign > 0 ? 1 : 0;
}
