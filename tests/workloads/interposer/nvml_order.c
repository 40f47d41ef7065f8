/* nvml_order: NVML memory information under a cap refers to the same device as CUDA's
 * accounting when NVML's indices are not CUDA's ordinals (run with nvml_reorder's
 * libnvidia-ml.so.1 first on LD_LIBRARY_PATH, VRAMSIM_DEVICES=2, VRAMSHIM_CAP=1GiB,
 * VRAMSHIM_CAP_CONTEXT=exclude). 64 MiB live on CUDA device 0, nothing on device 1: the
 * NVML handle of CUDA device 0 (NVML index 1 here) must report 64 MiB used, the other 0. */
#include <dlfcn.h>
#include <string.h>
#include "check.h"
#include "vs.h"

#define MiB (1024ull * 1024ull)

CUresult cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev);

int main(void) {
    vs_init();
    CK(cudaSetDevice(0));
    void *a;
    CK(cudaMalloc(&a, 64 * MiB));

    void *nv = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    EXPECT(nv != NULL);
    nvmlReturn_t (*init)(void) = dlsym(nv, "nvmlInit_v2");
    nvmlReturn_t (*by_index)(unsigned, nvmlDevice_t *) = dlsym(nv, "nvmlDeviceGetHandleByIndex_v2");
    nvmlReturn_t (*by_bus)(const char *, nvmlDevice_t *) = dlsym(nv, "nvmlDeviceGetHandleByPciBusId_v2");
    nvmlReturn_t (*info)(nvmlDevice_t, nvmlMemory_t *) = dlsym(nv, "nvmlDeviceGetMemoryInfo");
    nvmlReturn_t (*info2)(nvmlDevice_t, nvmlMemory_v2_t *) = dlsym(nv, "nvmlDeviceGetMemoryInfo_v2");
    EXPECT(init && by_index && by_bus && info && info2);
    EXPECT_EQ(init(), NVML_SUCCESS);

    /* The setting this test is about: NVML index i is CUDA device 1-i. */
    for (int d = 0; d < 2; d++) {
        char bus[64];
        EXPECT_EQ(cuDeviceGetPCIBusId(bus, sizeof bus, d), CUDA_SUCCESS);
        nvmlDevice_t h_bus, h_idx;
        EXPECT_EQ(by_bus(bus, &h_bus), NVML_SUCCESS);
        EXPECT_EQ(by_index((unsigned)(1 - d), &h_idx), NVML_SUCCESS);
        EXPECT(h_bus == h_idx);
    }

    for (int d = 0; d < 2; d++) {
        nvmlDevice_t h;
        EXPECT_EQ(by_index((unsigned)(1 - d), &h), NVML_SUCCESS);
        nvmlMemory_t m;
        EXPECT_EQ(info(h, &m), NVML_SUCCESS);
        nvmlMemory_v2_t m2;
        memset(&m2, 0, sizeof m2);
        m2.version = nvmlMemory_v2;
        EXPECT_EQ(info2(h, &m2), NVML_SUCCESS);
        printf("cuda %d: total=%lluMiB used=%lluMiB v2 total=%lluMiB used+reserved=%lluMiB\n", d,
               m.total / MiB, m.used / MiB, m2.total / MiB, (m2.used + m2.reserved) / MiB);
    }
    EXPECT_VS("live_bytes.0", 64 * MiB);
    EXPECT_VS("live_bytes.1", 0);
    CK(cudaFree(a));
    printf("nvml_order: ok\n");
    return 0;
}
