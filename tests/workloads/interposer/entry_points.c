/* entry_points: driver functions looked up through the runtime as PyTorch does
 * (cudaGetDriverEntryPointByVersion, version 12000, cudaEnableDefault), then used for the
 * expandable-segments VMM sequence and a plain cuMemAlloc: each request counted once. */
#include <string.h>
#include "check.h"
#include "vs.h"

static void *ep(const char *name) {
    void *f = NULL;
    cudaDriverEntryPointQueryResult q;
    CK(cudaGetDriverEntryPointByVersion(name, &f, 12000, cudaEnableDefault, &q));
    EXPECT_EQ(q, cudaDriverEntryPointSuccess);
    EXPECT(f != NULL);
    return f;
}

int main(void) {
    vs_init();
    CK(cudaFree(NULL));
    PFN_cuMemGetAllocationGranularity gran = ep("cuMemGetAllocationGranularity");
    PFN_cuMemCreate create = ep("cuMemCreate");
    PFN_cuMemRelease release = ep("cuMemRelease");
    PFN_cuMemAddressReserve reserve = ep("cuMemAddressReserve");
    PFN_cuMemAddressFree addrFree = ep("cuMemAddressFree");
    PFN_cuMemMap map = ep("cuMemMap");
    PFN_cuMemUnmap unmap = ep("cuMemUnmap");
    PFN_cuMemSetAccess setAccess = ep("cuMemSetAccess");
    PFN_cuMemAlloc_v2 alloc = ep("cuMemAlloc");
    PFN_cuMemFree_v2 mfree = ep("cuMemFree");
    PFN_cuMemGetInfo_v2 info = ep("cuMemGetInfo");
    /* deprecated spelling, same answer */
    void *f2 = NULL;
    cudaDriverEntryPointQueryResult q;
    CK(cudaGetDriverEntryPoint("cuMemCreate", &f2, cudaEnableDefault, &q));
    EXPECT(f2 == (void *)create);

    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    size_t g;
    EXPECT_EQ(gran(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED), CUDA_SUCCESS);
    CUdeviceptr va;
    EXPECT_EQ(reserve(&va, 8 * g, 0, 0, 0), CUDA_SUCCESS);
    CUmemGenericAllocationHandle hs[4];
    for (int i = 0; i < 4; i++) {
        EXPECT_EQ(create(&hs[i], g, &prop, 0), CUDA_SUCCESS);
        EXPECT_EQ(map(va + (CUdeviceptr)i * g, g, 0, hs[i], 0), CUDA_SUCCESS);
    }
    CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    EXPECT_EQ(setAccess(va, 4 * g, &acc, 1), CUDA_SUCCESS);
    CK(cudaMemset((void *)va, 7, 4 * g));
    EXPECT_VS("calls.cuMemCreate", 4);
    EXPECT_VS("live_count.0.vmm-handle", 4);
    EXPECT_VS("live_bytes.0", 4 * g);

    CUdeviceptr d;
    EXPECT_EQ(alloc(&d, 3 << 20), CUDA_SUCCESS);
    EXPECT_VS("calls.cuMemAlloc", 1);
    EXPECT_VS("live_bytes.0", 4 * g + (3 << 20));
    size_t fr, tot;
    EXPECT_EQ(info(&fr, &tot), CUDA_SUCCESS);
    EXPECT_VS("calls.cuMemGetInfo", 1);

    EXPECT_EQ(mfree(d), CUDA_SUCCESS);
    EXPECT_EQ(unmap(va, 4 * g), CUDA_SUCCESS);
    for (int i = 0; i < 4; i++) EXPECT_EQ(release(hs[i]), CUDA_SUCCESS);
    EXPECT_EQ(addrFree(va, 8 * g), CUDA_SUCCESS);
    EXPECT_VS("live_bytes.0", 0);
    EXPECT_VS("live_handles", 0);
    EXPECT_VS("live_entries", 0);
    printf("entry_points: ok g=%zu\n", g);
    return 0;
}
