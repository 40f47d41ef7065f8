/* vmm: the virtual-memory API as PyTorch's expandable segments and NCCL use it, reached via
 * dlopen + cuGetProcAddress_v2: physical handles are charged at cuMemCreate by
 * prop->location (host locations never), mappings are free, data really aliases. */
#include <dlfcn.h>
#include <string.h>
#include "check.h"
#include "vs.h"

static PFN_cuGetProcAddress_v2 gpa;
static void *get(const char *sym) {
    void *p = NULL;
    CUdriverProcAddressQueryResult st;
    EXPECT_EQ(gpa(sym, &p, 12000, 0, &st), CUDA_SUCCESS);
    EXPECT(p != NULL);
    return p;
}

int main(void) {
    vs_init();
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    EXPECT(h != NULL);
    gpa = (PFN_cuGetProcAddress_v2)dlsym(h, "cuGetProcAddress_v2");
    PFN_cuInit init = get("cuInit");
    PFN_cuDevicePrimaryCtxRetain retain = get("cuDevicePrimaryCtxRetain");
    PFN_cuCtxSetCurrent setCurrent = get("cuCtxSetCurrent");
    PFN_cuMemGetAllocationGranularity gran = get("cuMemGetAllocationGranularity");
    PFN_cuMemCreate create = get("cuMemCreate");
    PFN_cuMemRelease release = get("cuMemRelease");
    PFN_cuMemAddressReserve reserve = get("cuMemAddressReserve");
    PFN_cuMemAddressFree addrFree = get("cuMemAddressFree");
    PFN_cuMemMap map = get("cuMemMap");
    PFN_cuMemUnmap unmap = get("cuMemUnmap");
    PFN_cuMemSetAccess setAccess = get("cuMemSetAccess");
    PFN_cuMemcpyHtoD_v2 htod = get("cuMemcpyHtoD");
    PFN_cuMemcpyDtoH_v2 dtoh = get("cuMemcpyDtoH");

    EXPECT_EQ(init(0), CUDA_SUCCESS);
    CUcontext ctx;
    EXPECT_EQ(retain(&ctx, 0), CUDA_SUCCESS);
    EXPECT_EQ(setCurrent(ctx), CUDA_SUCCESS);

    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    size_t g = 0;
    EXPECT_EQ(gran(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), CUDA_SUCCESS);
    printf("granularity=%zu\n", g);

    CUmemGenericAllocationHandle a, b, hh;
    EXPECT_EQ(create(&a, 2 * g, &prop, 0), CUDA_SUCCESS);
    EXPECT_EQ(create(&b, g, &prop, 0), CUDA_SUCCESS);
    EXPECT_VS("live_bytes.0", 3 * g);
    EXPECT_VS("live_count.0.vmm-handle", 2);
    EXPECT_VS("live_handles", 2);

    /* host-location physical memory (NCCL's cuMemHostEnable): traced, never charged */
    CUmemAllocationProp hprop = prop;
    hprop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
    hprop.location.id = 0;
    CUresult hrc = create(&hh, g, &hprop, 0);
    printf("host cuMemCreate -> %d\n", (int)hrc);
    EXPECT_VS("live_bytes.0", 3 * g);
    if (hrc == CUDA_SUCCESS) EXPECT_VS("live_bytes.host", g);

    /* an invalid location: the driver's own error, nothing charged */
    CUmemAllocationProp bad = prop;
    bad.location.id = 77;
    CUmemGenericAllocationHandle x;
    printf("bad-device cuMemCreate -> %d\n", (int)create(&x, g, &bad, 0));
    EXPECT_VS("live_bytes.0", 3 * g);

    /* map a twice: the same handle at two addresses aliases; mappings are not charged */
    CUdeviceptr va;
    EXPECT_EQ(reserve(&va, 6 * g, 0, 0, 0), CUDA_SUCCESS);
    EXPECT_EQ(map(va, 2 * g, 0, a, 0), CUDA_SUCCESS);
    EXPECT_EQ(map(va + 2 * g, 2 * g, 0, a, 0), CUDA_SUCCESS);
    EXPECT_EQ(map(va + 4 * g, g, 0, b, 0), CUDA_SUCCESS);
    CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    EXPECT_EQ(setAccess(va, 5 * g, &acc, 1), CUDA_SUCCESS);
    EXPECT_VS("live_bytes.0", 3 * g);
    char in[256], out[256];
    for (int i = 0; i < 256; i++) in[i] = (char)(255 - i);
    EXPECT_EQ(htod(va + 100, in, sizeof in), CUDA_SUCCESS);
    EXPECT_EQ(dtoh(out, va + 2 * g + 100, sizeof out), CUDA_SUCCESS);
    EXPECT(memcmp(in, out, sizeof in) == 0);

    EXPECT_EQ(unmap(va, 5 * g), CUDA_SUCCESS);
    EXPECT_EQ(release(a), CUDA_SUCCESS);
    EXPECT_VS("live_bytes.0", g);
    EXPECT_EQ(release(b), CUDA_SUCCESS);
    if (hrc == CUDA_SUCCESS) EXPECT_EQ(release(hh), CUDA_SUCCESS);
    EXPECT_EQ(addrFree(va, 6 * g), CUDA_SUCCESS);
    /* releasing an unknown handle: the driver's answer, unchanged */
    printf("double cuMemRelease -> %d\n", (int)release(a));
    EXPECT_VS("live_bytes.0", 0);
    EXPECT_VS("live_bytes.host", 0);
    EXPECT_VS("live_handles", 0);
    EXPECT_VS("calls.cuMemCreate", 4);
    EXPECT_VS("calls.cuMemRelease", hrc == CUDA_SUCCESS ? 4 : 3);
    EXPECT_VS("peak_bytes.0", 3 * g);
    printf("vmm: ok\n");
    return 0;
}
