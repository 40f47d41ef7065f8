/* rt_entry: cudaGetDriverEntryPoint[ByVersion][_ptsz] return what the driver's own
 * cuGetProcAddress_v2 returns for the same base name, version and stream flags. */
#include <dlfcn.h>
#include <string.h>
#include "check.h"

static PFN_cuGetProcAddress_v2 gpa;

static void *drv(const char *sym, int ver, unsigned long long flags) {
    void *p = NULL;
    CUdriverProcAddressQueryResult st;
    if (gpa(sym, &p, ver, flags, &st) != CUDA_SUCCESS || st != CU_GET_PROC_ADDRESS_SUCCESS) return NULL;
    return p;
}

int main(void) {
    CK(cudaFree(NULL)); /* initialize the runtime: it loads libcuda.so.1 */
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    EXPECT(h != NULL);
    gpa = (PFN_cuGetProcAddress_v2)dlsym(h, "cuGetProcAddress_v2");
    EXPECT(gpa != NULL);

    void *f = NULL;
    cudaDriverEntryPointQueryResult q = 99;
    int rv = 0;
    CK(cudaRuntimeGetVersion(&rv));

    /* default flags on the plain export: legacy stream variant */
    CK(cudaGetDriverEntryPoint("cuMemAllocAsync", &f, cudaEnableDefault, &q));
    EXPECT_EQ(q, cudaDriverEntryPointSuccess);
    EXPECT(f != NULL && f == drv("cuMemAllocAsync", rv, CU_GET_PROC_ADDRESS_LEGACY_STREAM));
    EXPECT(f == dlsym(h, "cuMemAllocAsync"));
    /* default flags on the _ptsz export: per-thread default stream variant */
    extern cudaError_t cudaGetDriverEntryPoint_ptsz(const char *, void **, unsigned long long,
                                                    cudaDriverEntryPointQueryResult *);
    CK(cudaGetDriverEntryPoint_ptsz("cuMemAllocAsync", &f, cudaEnableDefault, &q));
    EXPECT(f != NULL && f == dlsym(h, "cuMemAllocAsync_ptsz"));
    /* explicit per-thread flag */
    CK(cudaGetDriverEntryPointByVersion("cuMemFreeAsync", &f, 12000, cudaEnablePerThreadDefaultStream, &q));
    EXPECT(f != NULL && f == dlsym(h, "cuMemFreeAsync_ptsz"));
    CK(cudaGetDriverEntryPointByVersion("cuMemFreeAsync", &f, 12000, cudaEnableLegacyStream, &q));
    EXPECT(f != NULL && f == dlsym(h, "cuMemFreeAsync"));
    /* version selection: cuMemAlloc is cuMemAlloc_v2 from 3.2 on */
    CK(cudaGetDriverEntryPointByVersion("cuMemAlloc", &f, 12000, cudaEnableDefault, &q));
    EXPECT(f != NULL && f == dlsym(h, "cuMemAlloc_v2"));
    CK(cudaGetDriverEntryPointByVersion("cuMemAlloc", &f, 3000, cudaEnableDefault, &q));
    EXPECT(f == drv("cuMemAlloc", 3000, 0));
    EXPECT(f != dlsym(h, "cuMemAlloc_v2"));
    /* the runtime's own lookup of cuGetProcAddress gives the driver's */
    CK(cudaGetDriverEntryPoint("cuGetProcAddress", &f, cudaEnableDefault, &q));
    EXPECT(f == drv("cuGetProcAddress", rv, 0));
    /* an unknown symbol: success, NULL, SymbolNotFound */
    f = (void *)1;
    CK(cudaGetDriverEntryPoint("cuNoSuchFunction", &f, cudaEnableDefault, &q));
    EXPECT(f == NULL);
    EXPECT_EQ(q, cudaDriverEntryPointSymbolNotFound);
    /* bad input */
    EXPECT_EQ(cudaGetDriverEntryPoint(NULL, &f, 0, &q), cudaErrorInvalidValue);
    EXPECT_EQ(cudaGetDriverEntryPoint("cuMemAlloc", NULL, 0, &q), cudaErrorInvalidValue);
    EXPECT_EQ(cudaGetDriverEntryPoint("cuMemAlloc", &f, 8, &q), cudaErrorInvalidValue);
    (void)cudaGetLastError();

    /* a pointer obtained through the runtime works */
    PFN_cuMemAlloc_v2 alloc;
    PFN_cuMemFree_v2 fr;
    CK(cudaGetDriverEntryPoint("cuMemAlloc", (void **)&alloc, cudaEnableDefault, &q));
    CK(cudaGetDriverEntryPoint("cuMemFree", (void **)&fr, cudaEnableDefault, &q));
    CUdeviceptr dp = 0;
    EXPECT_EQ(alloc(&dp, 1 << 20), CUDA_SUCCESS);
    EXPECT_EQ(fr(dp), CUDA_SUCCESS);
    printf("rt_entry: ok\n");
    return 0;
}
