/*
 * peer_access - peer access the program grants must reach memory allocated before and after
 * the grant (the pool's mappings included).
 *
 *   peer_access [runtime|driver] [capture]
 *
 * Needs two devices. Allocates block A on device 0, then, from device 1, launches a fill
 * "kernel" into A (must be refused: no peer access yet), enables peer access from device 1
 * to device 0 (cudaDeviceEnablePeerAccess, or cuCtxEnablePeerAccess with "driver"),
 * allocates block B on device 0 and fills A and B from device 1 (both must succeed), then
 * reads both back. Output: "peer_access: before=RC enable=RC a=RC b=RC data=OK|BAD end=RC".
 * With "capture" the peer access is enabled while device 1's thread captures stream CS (global
 * mode, begun just before; ended just after: end is its result, which must be 0, the capture
 * still valid; -1 without "capture"), and the fill of A from device 1 is launched during the
 * capture, on device 1's legacy stream (a launch is no call a capture forbids, and CS is
 * non-blocking: the legacy stream does not depend on it): the access must be granted at once.
 * Exit 0 when every value is as CUDA has it, 1 otherwise.
 */
#include <stdio.h>
#include <string.h>

#include "cuda_api.h"

#define N (3u << 20)

static int check(const void *dev, unsigned char v) {
    static unsigned char host[N];
    if (cudaMemcpy(host, dev, N, cudaMemcpyDeviceToHost) != cudaSuccess) return 0;
    for (size_t i = 0; i < N; i++)
        if (host[i] != v) return 0;
    return 1;
}

int main(int argc, char **argv) {
    int driver = argc > 1 && strcmp(argv[1], "driver") == 0;
    int capture = argc > 2 && strcmp(argv[2], "capture") == 0;
    int end = -1;
    cudaStream_t cs = NULL;
    void *a = NULL, *b = NULL;
    if (cudaSetDevice(0) != cudaSuccess || cudaMalloc(&a, N) != cudaSuccess) return 2;
    if (cudaSetDevice(1) != cudaSuccess) return 2;
    int before = (int)vramsimKernelFill(a, 0x11, N, 0, 0);
    (void)cudaGetLastError();
    if (capture) {
        if (cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking) != cudaSuccess ||
            cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal) != cudaSuccess)
            return 2;
    }
    int enable;
    if (driver) {
        /* the driver API as a runtime program reaches it: through the entry-point table */
        void *retain = NULL, *en = NULL;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPoint("cuDevicePrimaryCtxRetain", &retain, cudaEnableDefault, &q) ||
            cudaGetDriverEntryPoint("cuCtxEnablePeerAccess", &en, cudaEnableDefault, &q))
            return 2;
        CUcontext peer = NULL;
        if (((CUresult(*)(CUcontext *, CUdevice))retain)(&peer, 0) != CUDA_SUCCESS) return 2;
        enable = (int)((CUresult(*)(CUcontext, unsigned int))en)(peer, 0);
    } else {
        enable = (int)cudaDeviceEnablePeerAccess(0, 0);
    }
    int fa = -1;
    if (capture) {
        fa = (int)vramsimKernelFill(a, 0x5a, N, 0, 0);
        cudaGraph_t g = NULL;
        end = (int)cudaStreamEndCapture(cs, &g);
        if (g) (void)cudaGraphDestroy(g);
        (void)cudaStreamDestroy(cs);
    }
    if (cudaSetDevice(0) != cudaSuccess || cudaMalloc(&b, N) != cudaSuccess) return 2;
    if (cudaSetDevice(1) != cudaSuccess) return 2;
    if (!capture) fa = (int)vramsimKernelFill(a, 0x5a, N, 0, 0);
    int fb = (int)vramsimKernelFill(b, 0xa5, N, 0, 0);
    int data = cudaDeviceSynchronize() == cudaSuccess && fa == 0 && fb == 0 && check(a, 0x5a) &&
               check(b, 0xa5);
    printf("peer_access: before=%d enable=%d a=%d b=%d data=%s end=%d\n", before, enable, fa, fb,
           data ? "OK" : "BAD", end);
    return before != 0 && enable == 0 && data && end == (capture ? 0 : -1) ? 0 : 1;
}
