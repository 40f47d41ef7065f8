/* rt_more: stream capture state, legacy IPC handles, pointer attributes of host memory,
 * allocation from the default memory pool. Prints "rt_more: ok". */
#include <string.h>
#include "check.h"

int main(void) {
    CK(cudaSetDevice(0));
    cudaStream_t s;
    CK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, 0));

    /* capture: status through the runtime, per stream */
    enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusActive;
    CK(cudaStreamIsCapturing(s, &st));
    EXPECT_EQ(st, cudaStreamCaptureStatusNone);
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    CK(cudaThreadExchangeStreamCaptureMode(&mode));
    CK(cudaThreadExchangeStreamCaptureMode(&mode)); /* and back */
    EXPECT_EQ(mode, cudaStreamCaptureModeRelaxed);
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CK(cudaStreamIsCapturing(s, &st));
    EXPECT_EQ(st, cudaStreamCaptureStatusActive);
    unsigned long long id = 0;
#ifdef CUDART13
    CK(cudaStreamGetCaptureInfo(s, &st, &id, NULL, NULL, NULL, NULL));
#else
    CK(cudaStreamGetCaptureInfo(s, &st, &id));
#endif
    EXPECT_EQ(st, cudaStreamCaptureStatusActive);
    EXPECT(id != 0);
    cudaGraph_t g = NULL;
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaStreamIsCapturing(s, &st));
    EXPECT_EQ(st, cudaStreamCaptureStatusNone);

    /* legacy IPC: cudaMalloc memory has a handle, host memory has none */
    void *d = NULL;
    CK(cudaMalloc(&d, 4 << 20));
    cudaIpcMemHandle_t h;
    memset(&h, 0, sizeof h);
    CK(cudaIpcGetMemHandle(&h, d));
    char host[64];
    EXPECT_EQ(cudaIpcGetMemHandle(&h, host), cudaErrorInvalidValue);
    (void)cudaGetLastError();

    /* pointer attributes: unregistered host memory is not an error */
    struct cudaPointerAttributes a;
    CK(cudaPointerGetAttributes(&a, host));
    EXPECT_EQ(a.type, cudaMemoryTypeUnregistered);
    void *ph = NULL;
    CK(cudaMallocHost(&ph, 4096));
    CK(cudaPointerGetAttributes(&a, ph));
    EXPECT_EQ(a.type, cudaMemoryTypeHost);
    CK(cudaFreeHost(ph));
    void *m = NULL;
    CK(cudaMallocManaged(&m, 4096, cudaMemAttachGlobal));
    CK(cudaPointerGetAttributes(&a, m));
    EXPECT_EQ(a.type, cudaMemoryTypeManaged);
    CK(cudaFree(m));

    /* stream-ordered allocation from the device's default pool */
    cudaMemPool_t pool = NULL;
    CK(cudaDeviceGetDefaultMemPool(&pool, 0));
    EXPECT(pool != NULL);
    void *pa = NULL;
    CK(cudaMallocFromPoolAsync(&pa, 1 << 20, pool, s));
    CK(cudaMemsetAsync(pa, 3, 1 << 20, s));
    CK(cudaFreeAsync(pa, s));
    CK(cudaStreamSynchronize(s));

    CK(cudaFree(d));
    CK(cudaStreamDestroy(s));
    EXPECT_EQ(cudaStreamDestroy(NULL), cudaErrorInvalidResourceHandle);
    EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidResourceHandle);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    printf("rt_more: ok\n");
    return 0;
}
