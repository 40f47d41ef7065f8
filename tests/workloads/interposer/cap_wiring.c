/* cap_wiring: the hooks hand the cap what it needs.
 *   cap_wiring          with VRAMSHIM_CAP=64MiB VRAMSHIM_CAP_CONTEXT=exclude: every
 *                       memory-information path reports the cap, a request over it gets the
 *                       runtime's own OOM code (and last error), a driver request the
 *                       driver's, and freeing gives the room back.
 *   cap_wiring context  prints the free memory the runtime reports right after creating its
 *                       context (the context's footprint is charged to the cap). */
#include <dlfcn.h>
#include <string.h>
#include "check.h"
#include "vs.h"

#define MiB (1024ull * 1024ull)

int main(int argc, char **argv) {
    vs_init();
    size_t f, t;
    CK(cudaMemGetInfo(&f, &t));
    if (argc > 1 && !strcmp(argv[1], "context")) {
        printf("context: free=%zu total=%zu\n", f, t);
        return 0;
    }
    printf("cudaMemGetInfo total=%zu free<=total %d\n", t, f <= t);
    static char prop[4096];
    extern cudaError_t cudaGetDeviceProperties_v2(struct cudaDeviceProp *, int);
    CK(cudaGetDeviceProperties_v2((struct cudaDeviceProp *)prop, 0));
    size_t tg;
    memcpy(&tg, prop + 288, sizeof tg);
    printf("totalGlobalMem=%zu\n", tg);

    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    EXPECT(h != NULL);
    CUresult (*totalMem)(size_t *, CUdevice) = dlsym(h, "cuDeviceTotalMem_v2");
    PFN_cuMemAlloc_v2 dalloc = (PFN_cuMemAlloc_v2)dlsym(h, "cuMemAlloc_v2");
    PFN_cuMemFree_v2 dfree = (PFN_cuMemFree_v2)dlsym(h, "cuMemFree_v2");
    size_t tm;
    EXPECT_EQ(totalMem(&tm, 0), CUDA_SUCCESS);
    printf("cuDeviceTotalMem=%zu\n", tm);

    void *nv = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    EXPECT(nv != NULL);
    nvmlReturn_t (*init)(void) = dlsym(nv, "nvmlInit_v2");
    nvmlReturn_t (*handle)(unsigned, nvmlDevice_t *) = dlsym(nv, "nvmlDeviceGetHandleByIndex_v2");
    nvmlReturn_t (*info)(nvmlDevice_t, nvmlMemory_t *) = dlsym(nv, "nvmlDeviceGetMemoryInfo");
    EXPECT(init && handle && info);
    EXPECT_EQ(init(), NVML_SUCCESS);
    nvmlDevice_t d0;
    EXPECT_EQ(handle(0, &d0), NVML_SUCCESS);
    nvmlMemory_t m;
    EXPECT_EQ(info(d0, &m), NVML_SUCCESS);
    printf("nvml total=%llu used+free==total %d\n", m.total, m.used + m.free == m.total);

    void *a, *b;
    CK(cudaMalloc(&a, 40 * MiB));
    printf("second 40MiB -> %d\n", (int)cudaMalloc(&b, 40 * MiB));
    printf("last error -> %d\n", (int)cudaGetLastError());
    CUdeviceptr dp;
    printf("driver 40MiB -> %d\n", (int)dalloc(&dp, 40 * MiB));
    CK(cudaMemGetInfo(&f, &t));
    printf("free after 40MiB <= 24MiB %d\n", f <= 24 * MiB);
    CK(cudaFree(a));
    CK(cudaMalloc(&b, 40 * MiB));
    EXPECT_EQ(dalloc(&dp, 10 * MiB), CUDA_SUCCESS);
    EXPECT_EQ(dfree(dp), CUDA_SUCCESS);
    CK(cudaFree(b));
    EXPECT_VS("cap_refusals", 2);
    EXPECT_VS("live_bytes.0", 0);
    printf("cap_wiring: ok\n");
    return 0;
}
