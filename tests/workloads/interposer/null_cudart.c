/* null_cudart: a do-nothing libcudart.so.12 (cudaMalloc hands out fresh addresses, cudaFree
 * and cudaGetDevice succeed) for scripts/bench: under it, bench_malloc measures the
 * interposer's own per-call cost with nothing else in the way. Build:
 *   gcc -O2 -shared -fPIC -Wl,-soname,libcudart.so.12 -Wl,--version-script=V -o libcudart.so.12
 * with V = "libcudart.so.12 { global: *; };". */
#include <stddef.h>

/* Each thread hands out addresses from its own 4 GiB range, so that threads never see each
 * other's pointers (as with a real allocator). */
static unsigned long threads_seen;
static __thread unsigned long next_addr;

int cudaMalloc(void **p, size_t n) {
    if (!p) return 1;
    if (!next_addr) next_addr = (__atomic_add_fetch(&threads_seen, 1, __ATOMIC_RELAXED) + 1) << 32;
    next_addr += (n + 255) & ~(size_t)255;
    *p = (void *)next_addr;
    return 0;
}
int cudaFree(void *p) { (void)p; return 0; }
int cudaGetDevice(int *d) {
    if (!d) return 1;
    *d = 0;
    return 0;
}
const char *cudaGetErrorName(int e) { return e ? "error" : "cudaSuccess"; }
