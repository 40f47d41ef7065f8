/* cap_async: stream-ordered allocations under a cap, against a driver pool that keeps every
 * freed block cached (release threshold UINT64_MAX, as PyTorch's cudaMallocAsync backend
 * sets it), for the cap's integration tests (region/tests/cap_sim.rs).
 *
 *   cap_async ROUNDS   each round: cudaMallocAsync of a size that differs from every earlier
 *                      one (3 to 15 MiB, so the pool cannot hand a cached block out again),
 *                      cudaFreeAsync on the same stream; every fourth round also a plain
 *                      cudaMalloc of 8 MiB, kept for the next round. No synchronization.
 *                      Prints "async ok=N refused=R other=O" (refused: out-of-memory answers).
 */
#include <stdint.h>
#include "check.h"

#define MIB (1024ull * 1024ull)

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 40;
    CK(cudaSetDevice(0));
    CK(cudaFree(0));
    cudaMemPool_t pool;
    CK(cudaDeviceGetDefaultMemPool(&pool, 0));
    uint64_t keep = UINT64_MAX;
    CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    int ok = 0, refused = 0, other = 0;
    void *plain = NULL;
    for (int i = 0; i < rounds; i++) {
        size_t size = (3 + (size_t)(i % 13)) * MIB + (size_t)i * 64 * 1024;
        void *p = NULL;
        cudaError_t e = cudaMallocAsync(&p, size, s);
        if (e == cudaSuccess) {
            ok++;
            CK(cudaFreeAsync(p, s));
        } else if (e == cudaErrorMemoryAllocation) {
            refused++;
            (void)cudaGetLastError();
        } else {
            other++;
        }
        if (i % 4 == 3) {
            if (plain) CK(cudaFree(plain));
            plain = NULL;
            e = cudaMalloc(&plain, 8 * MIB);
            if (e == cudaSuccess) {
                ok++;
            } else if (e == cudaErrorMemoryAllocation) {
                refused++;
                plain = NULL;
                (void)cudaGetLastError();
            } else {
                other++;
                plain = NULL;
            }
        }
    }
    if (plain) CK(cudaFree(plain));
    CK(cudaStreamSynchronize(s));
    printf("async ok=%d refused=%d other=%d\n", ok, refused, other);
    return 0;
}
