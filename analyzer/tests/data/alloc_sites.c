/* Allocates device memory from two named functions (cudart through dlopen, so no headers are
 * needed), for the symbolization test (analyzer/tests/symbols.rs). Built with -g and frame
 * pointers; the functions are noinline so each is its own call site. */
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>

#ifdef REBUILT
/* A "new version" of the program: more code, so its executable segment differs. */
__attribute__((used)) static void padding(void) { __asm__ volatile(".rept 8192\n nop\n .endr"); }
#endif

typedef int (*malloc_fn)(void **, size_t);
typedef int (*free_fn)(void *);
static malloc_fn cuda_malloc;
static free_fn cuda_free;

__attribute__((noinline)) static void *alloc_weights(size_t n) {
    void *p = NULL;
    if (cuda_malloc(&p, n) != 0) return NULL;
    return p;
}

__attribute__((noinline)) static void *alloc_activations(size_t n) {
    void *p = NULL;
    if (cuda_malloc(&p, n) != 0) return NULL;
    return p;
}

int main(void) {
    void *h = dlopen("libcudart.so.12", RTLD_NOW);
    if (!h) {
        fprintf(stderr, "no libcudart.so.12: %s\n", dlerror());
        return 1;
    }
    cuda_malloc = (malloc_fn)dlsym(h, "cudaMalloc");
    cuda_free = (free_fn)dlsym(h, "cudaFree");
    void *w = alloc_weights(8 << 20);
    void *a[4];
    for (int i = 0; i < 4; i++) a[i] = alloc_activations(1 << 20);
    for (int i = 0; i < 4; i++) cuda_free(a[i]);
    cuda_free(w);
    return w ? 0 : 2;
}
