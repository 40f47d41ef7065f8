/*
 * oom_error - a refused cudaMalloc / cudaMallocAsync must leave the runtime's last error as
 * a real out-of-memory does: cudaGetLastError returns cudaErrorMemoryAllocation once, then
 * cudaSuccess.
 *
 *   oom_error BYTES
 *
 * Asks for BYTES (more than the device has) with cudaMalloc, then with cudaMallocAsync on
 * the legacy stream, checking the code and the last error after each, then allocates and
 * frees 1 MiB (the process carries on). Output: "oom_error: sync=RC,LAST,AFTER
 * async=RC,LAST,AFTER small=RC". Exit 0 when every value is as CUDA has it, 1 otherwise.
 */
#include <stdio.h>
#include <stdlib.h>

#include "cuda_api.h"

int main(int argc, char **argv) {
    size_t bytes = argc > 1 ? strtoull(argv[1], NULL, 0) : (size_t)1 << 40;
    (void)cudaGetLastError();
    void *p = NULL;
    int rc = (int)cudaMalloc(&p, bytes);
    int last = (int)cudaGetLastError();
    int after = (int)cudaGetLastError();
    void *q = NULL;
    int arc = (int)cudaMallocAsync(&q, bytes, 0);
    int alast = (int)cudaGetLastError();
    int aafter = (int)cudaGetLastError();
    void *s = NULL;
    int src = (int)cudaMalloc(&s, 1 << 20);
    if (src == 0) cudaFree(s);
    printf("oom_error: sync=%d,%d,%d async=%d,%d,%d small=%d\n", rc, last, after, arc, alast,
           aafter, src);
    int ok = rc == 2 && last == 2 && after == 0 && arc == 2 && alast == 2 && aafter == 0 && src == 0;
    return ok ? 0 : 1;
}
