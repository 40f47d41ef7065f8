/*
 * faults - allocations while the driver fails every Nth cuMemCreate / cuMemMap
 * (VRAMSIM_FAIL): every failure must be a clean cudaErrorMemoryAllocation, every success a
 * usable block (pattern written and read back), and requests after a failure must succeed.
 *
 *   faults ROUNDS
 *
 * Each round allocates 12 blocks of varied sizes (sub-page to multi-page), checks each one
 * that succeeded with a pattern, frees half at once and the rest at the end of the round.
 * Output: "faults: ok=N failed=N other_errors=N mismatches=N recovered=N" where recovered counts
 * failures followed (in the same round) by a successful allocation. Exit 1 if other_errors or
 * mismatches, 0 otherwise.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_api.h"

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 10;
    long ok = 0, failed = 0, other = 0, mism = 0, recovered = 0;
    unsigned char *host = malloc(16 << 20);
    for (int r = 0; r < rounds; r++) {
        void *blk[12] = {0};
        size_t sz[12];
        int pending_fail = 0;
        for (int i = 0; i < 12; i++) {
            sz[i] = (size_t)((i % 4) + 1) * (1536 << 10) + (size_t)r * 8192 + (size_t)i * 512;
            if (i % 5 == 0) sz[i] = 40000 + i * 1000;
            cudaError_t e = cudaMalloc(&blk[i], sz[i]);
            if (e == cudaErrorMemoryAllocation) {
                failed++;
                pending_fail = 1;
                blk[i] = NULL;
                continue;
            }
            if (e != cudaSuccess) {
                fprintf(stderr, "faults: cudaMalloc(%zu) -> %d\n", sz[i], (int)e);
                other++;
                blk[i] = NULL;
                continue;
            }
            ok++;
            if (pending_fail) {
                recovered++;
                pending_fail = 0;
            }
            memset(host, (unsigned char)(i + 1), sz[i]);
            if (cudaMemcpy(blk[i], host, sz[i], cudaMemcpyHostToDevice) != cudaSuccess) other++;
            memset(host, 0, sz[i]);
            if (cudaMemcpy(host, blk[i], sz[i], cudaMemcpyDeviceToHost) != cudaSuccess) other++;
            for (size_t k = 0; k < sz[i]; k += 997)
                if (host[k] != (unsigned char)(i + 1)) { mism++; break; }
            if (i % 2 == 1) {
                if (cudaFree(blk[i]) != cudaSuccess) other++;
                blk[i] = NULL;
            }
        }
        for (int i = 0; i < 12; i++)
            if (blk[i] && cudaFree(blk[i]) != cudaSuccess) other++;
    }
    printf("faults: ok=%ld failed=%ld other_errors=%ld mismatches=%ld recovered=%ld\n", ok, failed, other, mism, recovered);
    return (other || mism) ? 1 : 0;
}
