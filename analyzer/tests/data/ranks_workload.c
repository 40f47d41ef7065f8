/* A small multi-threaded, two-device allocation workload for the Parquet export test
 * (analyzer/tests/parquet_duckdb.rs): each thread works on its own device through cudart
 * (dlopen, so no headers are needed), allocates and frees blocks of varied sizes in a varied
 * order from two named call sites, makes stream-ordered allocations, and asks for blocks the
 * cap refuses. Built with -g and frame pointers so the call sites have names. */
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>

typedef int (*malloc_fn)(void **, size_t);
typedef int (*free_fn)(void *);
typedef int (*set_device_fn)(int);
typedef int (*malloc_async_fn)(void **, size_t, void *);
typedef int (*free_async_fn)(void *, void *);
typedef int (*sync_fn)(void);
static malloc_fn cuda_malloc;
static free_fn cuda_free;
static set_device_fn cuda_set_device;
static malloc_async_fn cuda_malloc_async;
static free_async_fn cuda_free_async;
static sync_fn cuda_sync;

#define SLOTS 24
#define ROUNDS 300

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

static void *worker(void *arg) {
    int dev = (int)(size_t)arg;
    if (cuda_set_device(dev) != 0) return (void *)1;
    unsigned long long x = 0x9e3779b97f4a7c15ull * (unsigned)(dev + 1);
    void *w = alloc_weights((size_t)(6 + dev) << 20);
    void *slot[SLOTS] = {0};
    for (int r = 0; r < ROUNDS; r++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        int i = (int)((x >> 33) % SLOTS);
        if (slot[i]) {
            cuda_free(slot[i]);
            slot[i] = NULL;
        } else {
            size_t n = (size_t)(((x >> 17) % 1500) + 1) << 10; /* 1 KiB .. 1.5 MiB */
            slot[i] = alloc_activations(n);
        }
        if (r % 50 == 25) {
            /* Stream-ordered, on the legacy stream. */
            void *a = NULL;
            if (cuda_malloc_async(&a, 3 << 20, NULL) == 0) cuda_free_async(a, NULL);
        }
        if (r % 100 == 60) {
            /* Past the cap: refused, and the trace says so. */
            void *big = alloc_activations((size_t)1 << 30);
            if (big) cuda_free(big);
        }
    }
    for (int i = 0; i < SLOTS; i++)
        if (slot[i]) cuda_free(slot[i]);
    cuda_sync();
    cuda_free(w);
    return NULL;
}

int main(void) {
    void *h = dlopen("libcudart.so.12", RTLD_NOW);
    if (!h) {
        fprintf(stderr, "no libcudart.so.12: %s\n", dlerror());
        return 1;
    }
    cuda_malloc = (malloc_fn)dlsym(h, "cudaMalloc");
    cuda_free = (free_fn)dlsym(h, "cudaFree");
    cuda_set_device = (set_device_fn)dlsym(h, "cudaSetDevice");
    cuda_malloc_async = (malloc_async_fn)dlsym(h, "cudaMallocAsync");
    cuda_free_async = (free_async_fn)dlsym(h, "cudaFreeAsync");
    cuda_sync = (sync_fn)dlsym(h, "cudaDeviceSynchronize");
    if (!cuda_malloc || !cuda_free || !cuda_set_device || !cuda_malloc_async || !cuda_free_async ||
        !cuda_sync) {
        fprintf(stderr, "cudart lacks an entry point\n");
        return 1;
    }
    pthread_t t[2];
    for (int d = 0; d < 2; d++) pthread_create(&t[d], NULL, worker, (void *)(size_t)d);
    int bad = 0;
    for (int d = 0; d < 2; d++) {
        void *r = NULL;
        pthread_join(t[d], &r);
        bad |= r != NULL;
    }
    return bad;
}
