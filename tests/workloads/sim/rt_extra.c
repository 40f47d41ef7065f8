/* rt_extra: pool attributes and trimming, host registration, IPC open (not simulated: a clear
 * error), peer copies, host functions and stream callbacks, priorities, PCI bus id, profiler.
 * Run with VRAMSIM_DEVICES=2. Prints "rt_extra: ok". */
#include <string.h>
#include "check.h"

static volatile int host_fn_ran, callback_status = -1;
static void host_fn(void *arg) { host_fn_ran = *(int *)arg; }
static void callback(cudaStream_t s, cudaError_t status, void *arg) {
    (void)s;
    (void)arg;
    callback_status = status;
}

int main(void) {
    CK(cudaSetDevice(0));
    cudaStream_t s;
    int least = 99, greatest = 99, prio = 99;
    CK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    EXPECT(greatest <= least);
    CK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, greatest));
    CK(cudaStreamGetPriority(s, &prio));
    EXPECT_EQ(prio, greatest);

    /* default pool: release threshold, usage, trim */
    cudaMemPool_t pool;
    CK(cudaDeviceGetDefaultMemPool(&pool, 0));
    unsigned long long thr = 64 << 20, used = 0;
    CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &thr));
    thr = 0;
    CK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &thr));
    EXPECT_EQ(thr, 64 << 20);
    void *p = NULL;
    CK(cudaMallocAsync(&p, 8 << 20, s));
    CK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used));
    EXPECT(used >= (8 << 20));
    CK(cudaFreeAsync(p, s));
    CK(cudaStreamSynchronize(s));
    CK(cudaMemPoolTrimTo(pool, 0));
    CK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &used));
    EXPECT_EQ(used, 0);
    CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CK(cudaMemPoolSetAccess(pool, &acc, 1));

    /* host registration */
    static char buf[1 << 16];
    CK(cudaHostRegister(buf, sizeof buf, cudaHostRegisterDefault));
    CK(cudaHostUnregister(buf));
    EXPECT_EQ(cudaHostRegister(NULL, 16, 0), cudaErrorInvalidValue);

    /* IPC: a handle can be made; opening one is not simulated and says so */
    void *d = NULL, *o = NULL;
    CK(cudaMalloc(&d, 1 << 20));
    cudaIpcMemHandle_t h;
    CK(cudaIpcGetMemHandle(&h, d));
    cudaError_t e = cudaIpcOpenMemHandle(&o, h, cudaIpcMemLazyEnablePeerAccess);
    EXPECT(e != cudaSuccess && o == NULL);
    (void)cudaGetLastError();

    /* peer copy device 1 -> device 0 */
    void *d1 = NULL;
    char in[256], out[256];
    for (int i = 0; i < 256; i++) in[i] = (char)i;
    CK(cudaSetDevice(1));
    CK(cudaMalloc(&d1, sizeof in));
    CK(cudaMemcpy(d1, in, sizeof in, cudaMemcpyHostToDevice));
    CK(cudaSetDevice(0));
    CK(cudaMemcpyPeerAsync(d, 0, d1, 1, sizeof in, s));
    CK(cudaMemcpyAsync(out, d, sizeof out, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    EXPECT(memcmp(in, out, sizeof in) == 0);

    /* host function and callback run in stream order, after a slow kernel */
    int token = 42;
    CK(vramsimKernelFill(d, 1, 4096, 10000, s));
    CK(cudaLaunchHostFunc(s, host_fn, &token));
    CK(cudaStreamAddCallback(s, callback, NULL, 0));
    cudaEvent_t ev;
    CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    CK(cudaEventRecordWithFlags(ev, s, 0));
    CK(cudaEventSynchronize(ev));
    CK(cudaStreamSynchronize(s));
    EXPECT_EQ(host_fn_ran, 42);
    EXPECT_EQ(callback_status, cudaSuccess);

    char bus[32] = {0};
    CK(cudaDeviceGetPCIBusId(bus, sizeof bus, 0));
    EXPECT(strlen(bus) > 0);
    EXPECT_EQ(cudaDeviceGetPCIBusId(bus, sizeof bus, 9), cudaErrorInvalidDevice);
    (void)cudaGetLastError();
    CK(cudaProfilerStart());
    CK(cudaProfilerStop());

    CK(cudaEventDestroy(ev));
    CK(cudaFree(d));
    CK(cudaSetDevice(1));
    CK(cudaFree(d1));
    CK(cudaStreamDestroy(s));
    printf("rt_extra: ok bus=%s\n", bus);
    return 0;
}
