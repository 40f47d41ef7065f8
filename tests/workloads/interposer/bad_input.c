/* bad_input: every call here is wrong in some way; the program prints what CUDA answered
 * (return code, out-values, last error). Run with and without the preload: identical. */
#include <dlfcn.h>
#include <string.h>
#include "check.h"
#include "vs.h"

#define SHOW(call)                                                                             \
    do {                                                                                       \
        int show_rc_ = (int)(call);                                                            \
        printf("%-48s -> %d last=%d\n", #call, show_rc_, (int)cudaGetLastError());             \
    } while (0)

int main(void) {
    vs_init();
    int stack_var = 42;
    void *p = (void *)0x1234;
    size_t f = 1, t = 1, pitch = 7;

    SHOW(cudaMalloc(NULL, 100));
    SHOW(cudaMalloc(&p, 0));
    printf("size-0 pointer is %s\n", p == NULL ? "NULL" : "not NULL");
    SHOW(cudaFree(&stack_var));
    SHOW(cudaFree(NULL));
    void *q;
    CK(cudaMalloc(&q, 1000));
    SHOW(cudaFree(q));
    SHOW(cudaFree(q)); /* double free */
    SHOW(cudaFreeHost(&stack_var));
    SHOW(cudaFreeAsync(&stack_var, 0));
    SHOW(cudaMallocAsync(NULL, 10, 0));
    SHOW(cudaMallocPitch(NULL, &pitch, 10, 10));
    SHOW(cudaMallocPitch(&p, NULL, 10, 10));
    SHOW(cudaMallocManaged(NULL, 10, cudaMemAttachGlobal));
    SHOW(cudaMallocHost(NULL, 10));
    SHOW(cudaMemGetInfo(NULL, NULL));
    SHOW(cudaMemGetInfo(&f, NULL));
    SHOW(cudaMemGetInfo(NULL, &t));
    SHOW(cudaGetDeviceProperties(NULL, 0));
    SHOW(cudaMalloc(&p, (size_t)1 << 62)); /* far too big */
    SHOW(cudaGetLastError());

    /* the driver side of the same mistakes */
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    EXPECT(h != NULL);
    PFN_cuMemFree_v2 mfree = (PFN_cuMemFree_v2)dlsym(h, "cuMemFree_v2");
    PFN_cuMemAlloc_v2 malloc_ = (PFN_cuMemAlloc_v2)dlsym(h, "cuMemAlloc_v2");
    PFN_cuMemRelease release = (PFN_cuMemRelease)dlsym(h, "cuMemRelease");
    PFN_cuMemCreate create = (PFN_cuMemCreate)dlsym(h, "cuMemCreate");
    PFN_cuMemGetInfo_v2 info = (PFN_cuMemGetInfo_v2)dlsym(h, "cuMemGetInfo_v2");
    EXPECT(mfree && malloc_ && release && create && info);
    printf("cuMemFree(stack) -> %d\n", (int)mfree((CUdeviceptr)&stack_var));
    printf("cuMemFree(0) -> %d\n", (int)mfree(0));
    printf("cuMemAlloc(NULL) -> %d\n", (int)malloc_(NULL, 10));
    CUdeviceptr d = 77;
    printf("cuMemAlloc(0 bytes) -> %d\n", (int)malloc_(&d, 0));
    printf("cuMemRelease(12345) -> %d\n", (int)release(12345));
    CUmemGenericAllocationHandle hh;
    printf("cuMemCreate(NULL prop) -> %d\n", (int)create(&hh, 2 << 20, NULL, 0));
    printf("cuMemGetInfo(NULL,NULL) -> %d\n", (int)info(NULL, NULL));
    EXPECT_VS("live_entries", 0);
    EXPECT_VS("live_bytes.0", 0);
    EXPECT_VS("panics", 0);
    printf("bad_input: done\n");
    return 0;
}
