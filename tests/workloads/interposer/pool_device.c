/* pool_device: allocations from a memory pool are charged to the pool's device, not to the
 * caller's current device. Two simulated devices (VRAMSIM_DEVICES=2); device 0 stays
 * current throughout while the program allocates from device 1's default pool (runtime)
 * and from a pool it creates on device 1 (driver, cuMemPoolCreate). */
#include <string.h>
#include "check.h"
#include "vs.h"

/* Not in cuda_api.h: the pool-creation entry point and its properties (88 bytes). */
typedef struct {
    CUmemAllocationType allocType;
    CUmemAllocationHandleType handleTypes;
    CUmemLocation location;
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned short usage;
    unsigned char reserved[54];
} PoolProps;
CUresult cuMemPoolCreate(CUmemoryPool *pool, const PoolProps *props);

int main(void) {
    vs_init();
    int n = 0;
    CK(cudaGetDeviceCount(&n));
    EXPECT(n == 2);
    CK(cudaSetDevice(0));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

    /* runtime: device 1's default pool, device 0 current */
    cudaMemPool_t pool1;
    CK(cudaDeviceGetDefaultMemPool(&pool1, 1));
    void *a, *b, *c;
    CK(cudaMallocFromPoolAsync(&a, 1 << 20, pool1, s));
    CK(cudaMallocFromPoolAsync_ptsz(&b, 3 << 16, pool1, cudaStreamPerThread));
    CK(cudaMalloc(&c, 5 << 16)); /* plain: the current device */
    int cur = -1;
    CK(cudaGetDevice(&cur));
    EXPECT(cur == 0);
    EXPECT_VS("live_bytes.1", (1 << 20) + (3 << 16));
    EXPECT_VS("live_bytes.0", 5 << 16);
    EXPECT_VS("live_count.1.async", 2);

    /* driver: a pool created on device 1 */
    PoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = 1;
    CUmemoryPool created;
    EXPECT_EQ(cuMemPoolCreate(&created, &props), CUDA_SUCCESS);
    CUdeviceptr d = 0;
    EXPECT_EQ(cuMemAllocFromPoolAsync(&d, 7 << 16, created, (CUstream)s), CUDA_SUCCESS);
    EXPECT_VS("live_bytes.1", (1 << 20) + (3 << 16) + (7 << 16));
    EXPECT_VS("live_bytes.0", 5 << 16);
    EXPECT_VS("calls.cudaMallocFromPoolAsync", 2);
    EXPECT_VS("calls.cuMemAllocFromPoolAsync", 1);

    CK(cudaFreeAsync(a, s));
    CK(cudaFreeAsync(b, cudaStreamPerThread));
    EXPECT_EQ(cuMemFreeAsync(d, (CUstream)s), CUDA_SUCCESS);
    CK(cudaFree(c));
    CK(cudaStreamSynchronize(s));
    CK(cudaStreamSynchronize(cudaStreamPerThread));
    EXPECT_VS("live_bytes.1", 0);
    EXPECT_VS("live_bytes.0", 0);
    EXPECT_VS("peak_bytes.1", (1 << 20) + (3 << 16) + (7 << 16));
    EXPECT_VS("peak_bytes.0", 5 << 16);
    EXPECT_VS("unknown_frees", 0);
    CK(cudaStreamDestroy(s));
    printf("pool_device: ok\n");
    return 0;
}
