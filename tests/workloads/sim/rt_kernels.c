/* rt_kernels: what PyTorch's CUDA libraries need beyond memory: kernel registration as nvcc's
 * host code does it (from a constructor, before main, without touching the driver), launches
 * that complete as no-ops in stream order (nothing is computed), function attributes,
 * occupancy, __device__ variables, 2D copies, IPC event handles, graph memory attributes and
 * the not-supported graph/library calls. Prints "rt_kernels: ok". */
#include <string.h>
#include "check.h"

static void **module;
static int registered_before_main;
static char fake_fatbin[64];
static void kernel_stub(void) {}
static void kernel_stub2(void) {}
static int device_var[16]; /* stands for a __device__ int[16] */

__attribute__((constructor)) static void register_module(void) {
    module = __cudaRegisterFatBinary(fake_fatbin);
    __cudaRegisterFunction(module, (const char *)kernel_stub, "k", "k", -1, 0, 0, 0, 0, 0);
    __cudaRegisterFunction(module, (const char *)kernel_stub2, "k2", "k2", -1, 0, 0, 0, 0, 0);
    __cudaRegisterVar(module, (char *)device_var, "device_var", "device_var", 0, sizeof device_var, 0, 0);
    __cudaRegisterFatBinaryEnd(module);
    registered_before_main = module != NULL;
}

static volatile int marker;
static void host_fn(void *arg) { marker = *(int *)arg; }

int main(void) {
    EXPECT(registered_before_main);
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    dim3 g = {4, 1, 1}, b = {256, 1, 1}, zero = {0, 1, 1}, big = {2048, 1, 1};

    /* <<<g, b, 0, s>>> as nvcc lowers it: push, pop, launch. */
    EXPECT_EQ(__cudaPushCallConfiguration(g, b, 128, s), 0);
    dim3 pg, pb;
    size_t shmem = 0;
    cudaStream_t ps = 0;
    CK(__cudaPopCallConfiguration(&pg, &pb, &shmem, &ps));
    EXPECT(pg.x == 4 && pb.x == 256 && shmem == 128 && ps == s);
    EXPECT_EQ(__cudaPopCallConfiguration(&pg, &pb, &shmem, &ps), cudaErrorInvalidValue);
    (void)cudaGetLastError();

    cudaKernel_t k = NULL;
    CK(__cudaGetKernel(&k, (const void *)kernel_stub));
    EXPECT(k != NULL);
    CK(__cudaLaunchKernel(k, g, b, NULL, 0, s));
    CK(cudaLaunchKernel((const void *)kernel_stub, g, b, NULL, 0, s));
    CK(cudaLaunchCooperativeKernel((const void *)kernel_stub2, g, b, NULL, 0, s));
    cudaLaunchConfig_t cfg = {g, b, 0, s, NULL, 0};
    CK(cudaLaunchKernelExC(&cfg, (const void *)kernel_stub, NULL));
    CK(cudaLaunchKernel((const void *)kernel_stub, g, b, NULL, 0, 0)); /* legacy stream */
    EXPECT_EQ(cudaLaunchKernel((const void *)kernel_stub, zero, b, NULL, 0, s), cudaErrorInvalidConfiguration);
    EXPECT_EQ(cudaLaunchKernel((const void *)kernel_stub, g, big, NULL, 0, s), cudaErrorInvalidConfiguration);
    EXPECT_EQ(cudaLaunchKernel(NULL, g, b, NULL, 0, s), cudaErrorInvalidDeviceFunction);
    EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidDeviceFunction);

    /* Launches are stream operations: a host function queued after them runs after them. */
    int v = 42;
    CK(cudaLaunchHostFunc(s, host_fn, &v));
    CK(cudaStreamSynchronize(s));
    EXPECT_EQ(marker, 42);
    CK(cudaStreamQuery(s));

    /* Launches during capture are captured, not run; the graph is instantiated and launched
     * (its kernel nodes do nothing: graphs_memory.c tests what its memory nodes do). */
    cudaStream_t cs;
    CK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
    CK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal));
    CK(cudaLaunchKernel((const void *)kernel_stub, g, b, NULL, 0, cs));
    cudaGraph_t graph = NULL;
    CK(cudaStreamEndCapture(cs, &graph));
    EXPECT(graph != NULL);
    cudaGraphExec_t exec = NULL;
    CK(cudaGraphInstantiateWithFlags(&exec, graph, 0));
    CK(cudaGraphLaunch(exec, cs));
    CK(cudaStreamSynchronize(cs));
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    EXPECT_EQ(cudaGraphDestroy(graph), cudaErrorInvalidValue);
    EXPECT_EQ(cudaGraphDestroy(NULL), cudaErrorInvalidValue);
    void *lib = NULL;
    EXPECT_EQ(cudaLibraryLoadData(&lib, fake_fatbin, 0, 0, 0, 0, 0, 0), cudaErrorNotSupported);
    EXPECT_EQ(cudaGetLastError(), cudaErrorNotSupported);
    unsigned long long gm = 99;
    CK(cudaDeviceGetGraphMemAttribute(0, 2 /* ReservedMemCurrent */, &gm));
    EXPECT_EQ(gm, 0);
    gm = 0;
    CK(cudaDeviceSetGraphMemAttribute(0, 3 /* ReservedMemHigh */, &gm));
    EXPECT_EQ(cudaDeviceSetGraphMemAttribute(0, 0, &gm), cudaErrorInvalidValue);

    /* Attributes and occupancy. */
    struct cudaFuncAttributes fa;
    memset(&fa, 0xff, sizeof fa);
    CK(cudaFuncGetAttributes(&fa, (const void *)kernel_stub));
    EXPECT_EQ(fa.maxThreadsPerBlock, 1024);
    EXPECT_EQ(fa.localSizeBytes, 0);
    CK(cudaFuncSetAttribute((const void *)kernel_stub, 8 /* MaxDynamicSharedMemorySize */, 96 * 1024));
    CK(cudaKernelSetAttributeForDevice(k, 8, 96 * 1024, 0));
    EXPECT_EQ(cudaKernelSetAttributeForDevice(k, 8, 0, 7), cudaErrorInvalidDevice);
    int blocks = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, (const void *)kernel_stub, 256, 0));
    EXPECT_EQ(blocks, 8);
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&blocks, (const void *)kernel_stub, 32, 0, 0));
    EXPECT_EQ(blocks, 32);

    /* __device__ variables: an address, and cudaMemcpyToSymbol writes there. */
    int *addr = NULL;
    CK(cudaGetSymbolAddress((void **)&addr, device_var));
    EXPECT(addr != NULL && addr != device_var);
    int src[4] = {1, 2, 3, 4};
    CK(cudaMemcpyToSymbol(device_var, src, sizeof src, 8, cudaMemcpyHostToDevice));
    EXPECT(addr[2] == 1 && addr[5] == 4 && addr[0] == 0);
    EXPECT_EQ(cudaMemcpyToSymbol(device_var, src, sizeof src, 60, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    EXPECT_EQ(cudaGetSymbolAddress((void **)&addr, src), cudaErrorInvalidSymbol);

    /* 2D copies: a 3x5 window of a pitched device buffer. */
    unsigned char host[64], back[64];
    for (int i = 0; i < 64; i++) host[i] = (unsigned char)i;
    unsigned char *dev = NULL;
    CK(cudaMalloc((void **)&dev, 4096));
    CK(cudaMemset(dev, 0xee, 4096));
    CK(cudaMemcpy2DAsync(dev, 512, host, 8, 5, 3, cudaMemcpyHostToDevice, s));
    CK(cudaStreamSynchronize(s));
    memset(back, 0, sizeof back);
    CK(cudaMemcpy2DAsync(back, 5, dev, 512, 5, 3, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    for (int r = 0; r < 3; r++)
        for (int c = 0; c < 5; c++) EXPECT_EQ(back[r * 5 + c], host[r * 8 + c]);
    unsigned char edge = 0;
    CK(cudaMemcpy(&edge, dev + 5, 1, cudaMemcpyDeviceToHost));
    EXPECT_EQ(edge, 0xee);
    EXPECT_EQ(cudaMemcpy2DAsync(dev, 4, host, 8, 5, 3, cudaMemcpyHostToDevice, s), cudaErrorInvalidPitchValue);
    CK(cudaFree(dev));

    /* IPC event handles (the driver opens them in the same process). */
    cudaEvent_t e, e2 = NULL;
    CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming | cudaEventInterprocess));
    cudaIpcEventHandle_t h;
    CK(cudaIpcGetEventHandle(&h, e));
    CK(cudaIpcOpenEventHandle(&e2, h));
    EXPECT(e2 != NULL);
    CK(cudaEventRecord(e, s));
    CK(cudaEventSynchronize(e2));
    CK(cudaEventDestroy(e));

    CK(cudaStreamDestroy(s));
    CK(cudaStreamDestroy(cs));
    __cudaUnregisterFatBinary(module);
    (void)cudaGetLastError();
    printf("rt_kernels: ok\n");
    return 0;
}
