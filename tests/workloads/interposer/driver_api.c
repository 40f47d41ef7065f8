/* driver_api: a driver-API-only program that reaches libcuda the way frameworks and ctypes
 * do: dlopen("libcuda.so.1") + dlsym("cuGetProcAddress_v2") + every entry point through it.
 * Also: cuGetProcAddress self-lookups, a thread with no current context, and host memory. */
#include <dlfcn.h>
#include <pthread.h>
#include <string.h>
#include "check.h"
#include "vs.h"

#define cudaGetErrorName(e) "(driver program)"

static PFN_cuGetProcAddress_v2 gpa;
static void *get(const char *sym, int ver, unsigned long long flags) {
    void *p = NULL;
    CUdriverProcAddressQueryResult st;
    EXPECT_EQ(gpa(sym, &p, ver, flags, &st), CUDA_SUCCESS);
    EXPECT_EQ(st, CU_GET_PROC_ADDRESS_SUCCESS);
    EXPECT(p != NULL);
    return p;
}

static PFN_cuMemAlloc_v2 alloc;
static CUresult thread_rc = -1;
static void *no_context_thread(void *arg) {
    (void)arg;
    CUdeviceptr d = 0;
    thread_rc = alloc(&d, 1 << 20); /* no current context on this thread */
    return NULL;
}

int main(void) {
    vs_init();
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    EXPECT(h != NULL);
    gpa = (PFN_cuGetProcAddress_v2)dlsym(h, "cuGetProcAddress_v2");
    EXPECT(gpa != NULL);

    /* self-lookups return the matching ABI */
    EXPECT(get("cuGetProcAddress", 12000, 0) == (void *)gpa);
    EXPECT(get("cuGetProcAddress", 11030, 0) == dlsym(h, "cuGetProcAddress"));

    PFN_cuInit init = (PFN_cuInit)get("cuInit", 12000, 0);
    CUresult (*deviceGet)(CUdevice *, int) = get("cuDeviceGet", 12000, 0);
    PFN_cuDevicePrimaryCtxRetain retain = (PFN_cuDevicePrimaryCtxRetain)get("cuDevicePrimaryCtxRetain", 12000, 0);
    PFN_cuCtxSetCurrent setCurrent = (PFN_cuCtxSetCurrent)get("cuCtxSetCurrent", 12000, 0);
    alloc = (PFN_cuMemAlloc_v2)get("cuMemAlloc", 12000, 0);
    PFN_cuMemFree_v2 mfree = (PFN_cuMemFree_v2)get("cuMemFree", 12000, 0);
    CUresult (*allocPitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned) = get("cuMemAllocPitch", 12000, 0);
    CUresult (*allocManaged)(CUdeviceptr *, size_t, unsigned) = get("cuMemAllocManaged", 12000, 0);
    PFN_cuMemGetInfo_v2 memGetInfo = (PFN_cuMemGetInfo_v2)get("cuMemGetInfo", 12000, 0);
    CUresult (*totalMem)(size_t *, CUdevice) = get("cuDeviceTotalMem", 12000, 0);
    CUresult (*allocHost)(void **, size_t) = get("cuMemAllocHost", 12000, 0);
    CUresult (*hostAlloc)(void **, size_t, unsigned) = get("cuMemHostAlloc", 12000, 0);
    CUresult (*freeHost)(void *) = get("cuMemFreeHost", 12000, 0);
    PFN_cuMemcpyHtoD_v2 htod = (PFN_cuMemcpyHtoD_v2)get("cuMemcpyHtoD", 12000, 0);
    PFN_cuMemcpyDtoH_v2 dtoh = (PFN_cuMemcpyDtoH_v2)get("cuMemcpyDtoH", 12000, 0);
    /* the same pointers a plain dlsym hands out */
    EXPECT((void *)alloc == dlsym(h, "cuMemAlloc_v2"));
    EXPECT((void *)mfree == dlsym(h, "cuMemFree_v2"));

    EXPECT_EQ(init(0), CUDA_SUCCESS);
    CUdevice dev;
    EXPECT_EQ(deviceGet(&dev, 0), CUDA_SUCCESS);

    /* no context yet on any thread: the real error comes back, nothing is charged */
    pthread_t t;
    pthread_create(&t, NULL, no_context_thread, NULL);
    pthread_join(t, NULL);
    printf("no-context cuMemAlloc -> %d\n", (int)thread_rc);
    EXPECT_VS("live_entries", 0);

    CUcontext ctx;
    EXPECT_EQ(retain(&ctx, dev), CUDA_SUCCESS);
    EXPECT_EQ(setCurrent(ctx), CUDA_SUCCESS);

    size_t free0, total0, tm;
    EXPECT_EQ(memGetInfo(&free0, &total0), CUDA_SUCCESS);
    EXPECT_EQ(totalMem(&tm, dev), CUDA_SUCCESS);
    EXPECT(tm == total0);

    CUdeviceptr d[5];
    unsigned long long bytes = 0;
    for (int i = 0; i < 5; i++) {
        size_t sz = (size_t)(i + 1) << 20;
        EXPECT_EQ(alloc(&d[i], sz), CUDA_SUCCESS);
        bytes += sz;
    }
    CUdeviceptr dp;
    size_t pitch;
    EXPECT_EQ(allocPitch(&dp, &pitch, 300, 10, 4), CUDA_SUCCESS);
    bytes += (unsigned long long)pitch * 10;
    CUdeviceptr dm;
    EXPECT_EQ(allocManaged(&dm, 65536, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
    bytes += 65536;
    EXPECT_VS("calls.cuMemAlloc", 6); /* 5 + the no-context one */
    EXPECT_VS("alloc_failures", 1);
    EXPECT_VS("live_count.0.driver", 5);
    EXPECT_VS("live_count.0.pitch", 1);
    EXPECT_VS("live_count.0.managed", 1);
    EXPECT_VS("live_bytes.0", bytes);

    void *h1, *h2;
    EXPECT_EQ(allocHost(&h1, 4096), CUDA_SUCCESS);
    EXPECT_EQ(hostAlloc(&h2, 1000, CU_MEMHOSTALLOC_PORTABLE), CUDA_SUCCESS);
    EXPECT_VS("live_bytes.host", 5096);
    EXPECT_VS("live_bytes.0", bytes);

    char in[1000], out[1000];
    for (int i = 0; i < 1000; i++) in[i] = (char)(i * 13);
    EXPECT_EQ(htod(d[2], in, sizeof in), CUDA_SUCCESS);
    EXPECT_EQ(dtoh(out, d[2], sizeof out), CUDA_SUCCESS);
    EXPECT(memcmp(in, out, sizeof in) == 0);

    for (int i = 0; i < 5; i++) EXPECT_EQ(mfree(d[i]), CUDA_SUCCESS);
    EXPECT_EQ(mfree(dp), CUDA_SUCCESS);
    EXPECT_EQ(mfree(dm), CUDA_SUCCESS);
    EXPECT_EQ(freeHost(h1), CUDA_SUCCESS);
    EXPECT_EQ(freeHost(h2), CUDA_SUCCESS);
    EXPECT_VS("live_bytes.0", 0);
    EXPECT_VS("live_bytes.host", 0);
    EXPECT_VS("live_entries", 0);
    EXPECT_VS("peak_bytes.0", bytes);
    EXPECT_VS("unknown_frees", 0);
    EXPECT_VS("calls.cuMemFree", 7);
    printf("driver_api: ok\n");
    return 0;
}
