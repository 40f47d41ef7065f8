/* alloc_suite: every runtime allocation path, with the live table checked after each phase.
 *
 * Built three ways (see interposer/tests/interception.rs):
 *   linked to the shared runtime (-DLAYER_RUNTIME=1), to the static runtime
 *   (-DLAYER_RUNTIME=0: the runtime is inside the executable, only its driver calls can be
 *   seen), or with -DUSE_DLOPEN -DLAYER_RUNTIME=1 (dlopen("libcudart.so.12") + dlsym, what
 *   frameworks and ctypes do). stdout is identical with and without the preload. */
#include <string.h>
#include "check.h"
#include "vs.h"

#ifdef USE_DLOPEN
/* nothing of the runtime is linked: CK's error names are not available */
#define cudaGetErrorName(e) "(dlopen build)"
#endif

#ifndef LAYER_RUNTIME
#define LAYER_RUNTIME 1
#endif

static struct {
    cudaError_t (*malloc)(void **, size_t);
    cudaError_t (*free)(void *);
    cudaError_t (*mallocPitch)(void **, size_t *, size_t, size_t);
    cudaError_t (*malloc3D)(struct cudaPitchedPtr *, struct cudaExtent);
    cudaError_t (*mallocManaged)(void **, size_t, unsigned);
    cudaError_t (*mallocHost)(void **, size_t);
    cudaError_t (*hostAlloc)(void **, size_t, unsigned);
    cudaError_t (*freeHost)(void *);
    cudaError_t (*memGetInfo)(size_t *, size_t *);
    cudaError_t (*memcpy)(void *, const void *, size_t, enum cudaMemcpyKind);
    cudaError_t (*getDeviceProperties)(struct cudaDeviceProp *, int);
} R;

static void load(void) {
#ifdef USE_DLOPEN
    void *h = dlopen("libcudart.so.12", RTLD_NOW | RTLD_LOCAL);
    EXPECT(h != NULL);
#define L(field, name) *(void **)&R.field = dlsym(h, #name); EXPECT(R.field != NULL)
#else
#define L(field, name) *(void **)&R.field = (void *)&name
#endif
    L(malloc, cudaMalloc);
    L(free, cudaFree);
    L(mallocPitch, cudaMallocPitch);
    L(malloc3D, cudaMalloc3D);
    L(mallocManaged, cudaMallocManaged);
    L(mallocHost, cudaMallocHost);
    L(hostAlloc, cudaHostAlloc);
    L(freeHost, cudaFreeHost);
    L(memGetInfo, cudaMemGetInfo);
    L(memcpy, cudaMemcpy);
#ifdef USE_DLOPEN
    L(getDeviceProperties, cudaGetDeviceProperties_v2);
#else
    extern cudaError_t cudaGetDeviceProperties_v2(struct cudaDeviceProp *, int);
    L(getDeviceProperties, cudaGetDeviceProperties_v2);
#endif
}

#define N 10

int main(void) {
    int pre = vs_init();
    load();
    size_t f0, t0;
    CK(R.memGetInfo(&f0, &t0));
    printf("total=%zu\n", t0);

    /* plain allocations */
    void *p[N];
    unsigned long long dev = 0;
    for (int i = 0; i < N; i++) {
        size_t sz = (size_t)(i + 1) * 1000003u;
        CK(R.malloc(&p[i], sz));
        dev += sz;
    }
    EXPECT_VS("live_bytes.0", dev);
    EXPECT_VS("live_count.0", N);
    EXPECT_VS("live_entries", N);
#if LAYER_RUNTIME
    EXPECT_VS("calls.cudaMalloc", N);
    EXPECT_VS("live_count.0.runtime", N);
    /* the runtime's own cuMemAlloc_v2 (through our cuGetProcAddress) was not counted again */
    EXPECT_VS("calls.cuMemAlloc", 0);
    EXPECT_VS_GE("nested", N); /* this thread passed the runtime's own driver calls through */
#else
    EXPECT_VS("calls.cudaMalloc", 0);
    EXPECT_VS("calls.cuMemAlloc", N);
    EXPECT_VS("live_count.0.driver", N);
#endif

    /* data goes through untouched */
    char in[4096], out[4096];
    for (int i = 0; i < 4096; i++) in[i] = (char)(i * 7);
    CK(R.memcpy(p[3], in, sizeof in, cudaMemcpyHostToDevice));
    CK(R.memcpy(out, p[3], sizeof out, cudaMemcpyDeviceToHost));
    EXPECT(memcmp(in, out, sizeof in) == 0);

    /* pitched, 3D, managed */
    void *pp;
    size_t pitch = 0;
    CK(R.mallocPitch(&pp, &pitch, 1000, 33));
    EXPECT(pitch >= 1000);
    dev += (unsigned long long)pitch * 33;
    struct cudaPitchedPtr p3;
    struct cudaExtent e = {513, 7, 3};
    CK(R.malloc3D(&p3, e));
    dev += (unsigned long long)p3.pitch * 7 * 3;
    void *pm;
    CK(R.mallocManaged(&pm, 4096, cudaMemAttachGlobal));
    dev += 4096;
    EXPECT_VS("live_bytes.0", dev);
    EXPECT_VS("live_count.0", N + 3);
    EXPECT_VS("live_count.0.managed", 1);
    EXPECT_VS("live_count.0.pitch", 2);
    printf("pitch=%zu pitch3d=%zu\n", pitch, p3.pitch);

    /* host memory: traced, never device */
    void *h1, *h2;
    CK(R.mallocHost(&h1, 8192));
    CK(R.hostAlloc(&h2, 100, cudaHostAllocDefault));
    EXPECT_VS("live_bytes.host", 8292);
    EXPECT_VS("live_bytes.0", dev);

    /* memory info and properties are real (no cap configured) */
    size_t f1, t1;
    CK(R.memGetInfo(&f1, &t1));
    EXPECT(t1 == t0);
    EXPECT(f1 < f0);
    static char propbuf[4096];
    CK(R.getDeviceProperties((struct cudaDeviceProp *)propbuf, 0));
    size_t total_global;
    memcpy(&total_global, propbuf + 288, sizeof total_global);
    EXPECT(total_global == t0);

    /* frees */
    for (int i = 0; i < N; i++) CK(R.free(p[i]));
    CK(R.free(pp));
    CK(R.free(p3.ptr));
    CK(R.free(pm));
    CK(R.freeHost(h1));
    CK(R.freeHost(h2));
    CK(R.free(NULL));
    EXPECT_VS("live_bytes.0", 0);
    EXPECT_VS("live_count.0", 0);
    EXPECT_VS("live_bytes.host", 0);
    EXPECT_VS("live_entries", 0);
    EXPECT_VS("peak_bytes.0", dev);
    EXPECT_VS("unknown_frees", 0);
    EXPECT_VS("panics", 0);
    fprintf(stderr, "alloc_suite: preloaded=%d device_bytes=%llu\n", pre, dev);
    printf("alloc_suite: ok\n");
    return 0;
}
