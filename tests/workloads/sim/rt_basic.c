/* rt_basic: the runtime API end to end on one device. Prints "rt_basic: ok" and exits 0.
 * Build: linked against libcudart.so.12 (Link::SharedRuntime), .so.13 (-DCUDART13) or
 * libcudart_static.a; -DREAL_CUDART leaves out cuda-sim's own kernel entry points so the
 * same source links against NVIDIA's libcudart.so.12. */
#include <stdint.h>
#include <string.h>
#include "check.h"

int main(void) {
    int rv = 0, dv = -1, n = 0, dev = -1;
    CK(cudaRuntimeGetVersion(&rv));
    CK(cudaDriverGetVersion(&dv));
    CK(cudaGetDeviceCount(&n));
    EXPECT(n >= 1);
    CK(cudaSetDevice(0));
    CK(cudaGetDevice(&dev));
    EXPECT_EQ(dev, 0);
    printf("runtime=%d driver=%d devices=%d\n", rv, dv, n);

    size_t free0 = 0, total = 0;
    CK(cudaMemGetInfo(&free0, &total));
    EXPECT(total > 0 && free0 <= total);

    /* cudaDeviceProp: name at 0, totalGlobalMem at offset 288 in 12.x and 13.x alike. */
    static unsigned char propbuf[4096];
    memset(propbuf, 0xAB, sizeof propbuf);
    CK(cudaGetDeviceProperties((struct cudaDeviceProp *)propbuf, 0));
    size_t tgm;
    memcpy(&tgm, propbuf + 288, sizeof tgm);
    EXPECT_EQ(tgm, total);
    EXPECT(propbuf[0] != 0);
    printf("name=%s totalGlobalMem=%zu\n", (char *)propbuf, tgm);
    /* the layout differs between 12.x (1032 bytes) and 13.0 (1008 bytes) */
#ifdef CUDART13
    const size_t prop_size = 1008, mpc_off = 384;
#else
    const size_t prop_size = 1032, mpc_off = 388;
#endif
    EXPECT(propbuf[prop_size] == 0xAB && propbuf[prop_size - 1] == 0); /* written exactly */
    int mpc = 0, mpa = -1;
    memcpy(&mpc, propbuf + mpc_off, sizeof mpc);
    CK(cudaDeviceGetAttribute(&mpa, cudaDevAttrMultiProcessorCount, 0));
    EXPECT_EQ(mpc, mpa);
    int major = 0;
    CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
    EXPECT(major > 0);

    /* malloc / memcpy round trip */
    const size_t N = 3 << 20;
    unsigned char *h = malloc(N), *back = malloc(N);
    for (size_t i = 0; i < N; i++) h[i] = (unsigned char)(i * 7 + 1);
    void *d = NULL, *d2 = NULL;
    CK(cudaMalloc(&d, N));
    EXPECT(d != NULL);
    size_t free1 = 0;
    CK(cudaMemGetInfo(&free1, &total));
    EXPECT(free1 < free0);
    CK(cudaMemcpy(d, h, N, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&d2, N));
    CK(cudaMemcpy(d2, d, N, cudaMemcpyDeviceToDevice));
    memset(back, 0, N);
    CK(cudaMemcpy(back, d2, N, cudaMemcpyDeviceToHost));
    EXPECT(memcmp(h, back, N) == 0);
    CK(cudaMemcpy(back, d, N, cudaMemcpyDefault));
    EXPECT(memcmp(h, back, N) == 0);
    CK(cudaMemset(d, 0x5A, N));
    CK(cudaMemcpy(back, d, N, cudaMemcpyDeviceToHost));
    EXPECT(back[0] == 0x5A && back[N - 1] == 0x5A);

    struct cudaPointerAttributes pa;
    CK(cudaPointerGetAttributes(&pa, d));
    EXPECT_EQ(pa.type, cudaMemoryTypeDevice);
    EXPECT_EQ(pa.device, 0);

    /* zero-size allocation: success and NULL */
    void *z = (void *)1;
    CK(cudaMalloc(&z, 0));
    EXPECT(z == NULL);
    CK(cudaFree(NULL));

    /* streams, async allocation, async copies, events */
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    void *a = NULL;
    CK(cudaMallocAsync(&a, N, s));
    CK(cudaMemcpyAsync(a, h, N, cudaMemcpyHostToDevice, s));
    CK(cudaMemsetAsync(a, 0x11, 4096, s));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreateWithFlags(&e1, cudaEventDefault));
    CK(cudaEventRecord(e0, s));
#ifndef REAL_CUDART
    /* a slow "kernel": the event after it completes only when the stream reaches it */
    CK(vramsimKernelFill(a, 0x77, 4096, 20000, s));
#endif
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventQuery(e1));
    float ms = -1;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    EXPECT(ms >= 0);
    CK(cudaMemcpyAsync(back, a, N, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    CK(cudaStreamQuery(s));
#ifndef REAL_CUDART
    EXPECT(back[0] == 0x77 && back[4095] == 0x77);
#else
    EXPECT(back[0] == 0x11 && back[4095] == 0x11);
#endif
    EXPECT(memcmp(back + 4096, h + 4096, N - 4096) == 0);
    CK(cudaFreeAsync(a, s));
    CK(cudaMallocAsync_ptsz(&a, 1 << 20, 0));
    CK(cudaFreeAsync_ptsz(a, 0));
    CK(cudaStreamSynchronize(s));

    cudaStream_t s2;
    CK(cudaStreamCreate(&s2));
    CK(cudaStreamWaitEvent(s2, e1, 0));
    CK(cudaStreamSynchronize(s2));
    CK(cudaStreamDestroy(s2));
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    CK(cudaStreamDestroy(s));

    /* other allocation paths */
    void *p = NULL, *m = NULL, *hp = NULL, *ha = NULL;
    size_t pitch = 0;
    CK(cudaMallocPitch(&p, &pitch, 1000, 10));
    EXPECT(p != NULL && pitch >= 1000);
    CK(cudaFree(p));
    struct cudaPitchedPtr pp;
    struct cudaExtent ext = {100, 4, 3};
    CK(cudaMalloc3D(&pp, ext));
    EXPECT(pp.ptr != NULL && pp.pitch >= 100 && pp.xsize == 100 && pp.ysize == 4);
    CK(cudaFree(pp.ptr));
    CK(cudaMallocManaged(&m, 1 << 20, cudaMemAttachGlobal));
    ((volatile char *)m)[0] = 1; /* managed memory is host-accessible */
    CK(cudaFree(m));
    CK(cudaMallocHost(&hp, 1 << 16));
    memset(hp, 1, 1 << 16);
    CK(cudaFreeHost(hp));
    CK(cudaHostAlloc(&ha, 1 << 16, cudaHostAllocDefault));
    CK(cudaFreeHost(ha));

    CK(cudaFree(d));
    CK(cudaFree(d2));
    CK(cudaDeviceSynchronize());
    size_t free2 = 0;
    CK(cudaMemGetInfo(&free2, &total));
    EXPECT(free2 > free1); /* (a stream-ordered pool may keep some memory cached) */
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    free(h);
    free(back);
    printf("rt_basic: ok\n");
    return 0;
}
