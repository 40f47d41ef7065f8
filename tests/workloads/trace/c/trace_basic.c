/* trace_basic: a fixed sequence of allocation calls with distinctive sizes, for the tracer's
 * end-to-end test. Prints one line per call, "op size ptr rc", in call order:
 *   alloc 10001 0x... 0
 * The test checks that the trace holds the same calls, in the same order, with these fields. */
#include <stdint.h>
#include "check.h"

static void line(const char *op, size_t size, void *p, int rc) {
    printf("%s %zu %p %d\n", op, size, p, rc);
}

int main(void) {
    void *a = 0, *b = 0, *c = 0, *h = 0, *big = 0;
    cudaStream_t s;
    CK(cudaSetDevice(0));
    CK(cudaStreamCreate(&s));
    int rc = cudaMalloc(&a, 10001);
    line("alloc", 10001, a, rc);
    rc = cudaMalloc(&b, 20002);
    line("alloc", 20002, b, rc);
    rc = cudaMallocAsync(&c, 30003, s);
    line("alloc_async", 30003, c, rc);
    rc = cudaMallocHost(&h, 40004);
    line("alloc_host", 40004, h, rc);
    /* A request the device cannot serve: the trace records the real OOM result. */
    rc = cudaMalloc(&big, (size_t)1 << 50);
    line("alloc", (size_t)1 << 50, big, rc);
    (void)cudaGetLastError();
    size_t fr = 0, tot = 0;
    rc = cudaMemGetInfo(&fr, &tot);
    printf("meminfo %zu %zu %d\n", fr, tot, rc);
    rc = cudaFreeAsync(c, s);
    line("free_async", 30003, c, rc);
    CK(cudaStreamSynchronize(s));
    rc = cudaFree(b);
    line("free", 20002, b, rc);
    rc = cudaFreeHost(h);
    line("free_host", 40004, h, rc);
    rc = cudaFree(a);
    line("free", 10001, a, rc);
    fflush(stdout);
    return 0;
}
