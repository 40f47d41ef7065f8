/*
 * capture_graph - a graph allocation through the pool: during a stream capture a
 * cudaMallocAsync on the capturing stream for more than the pool holds (it would have to
 * grow, which the capture forbids) must succeed, as it does without the library: CUDA makes
 * it an allocation node of the graph. The graph is instantiated and launched, and the
 * allocation freed.
 *
 *   capture_graph global|local inside|outside [capped] [prefree]
 *
 * Before the capture: 4 MiB allocated and freed (cudaFree) and the device synchronized: the
 * pool holds that much. Then stream CS is captured in the given mode: cudaMallocAsync 4 MiB
 * (what the pool holds) and 64 MiB (more) on CS, each filled on CS; with "inside" both are
 * freed on CS within the capture (free nodes), with "outside" the 4 MiB block is, and the
 * 64 MiB allocation is freed after the first launch, on stream S (cudaFreeAsync), and after
 * the second with cudaFree. After the capture, before any launch, 4 MiB more is allocated on
 * CS (not captured): its bytes must not be the graph's 4 MiB block's (every launch writes
 * those: "overlap" is 1 when they are). The graph is instantiated and launched twice (S
 * synchronized after each), then destroyed; the device's graph memory
 * (cudaDeviceGetGraphMemAttribute, used and reserved) must then be 0, and a 64 MiB cudaMalloc
 * must succeed.
 * With "prefree" a 4 MiB block is allocated on CS before the capture (cudaMallocAsync: the
 * pool serves it) and filled, and freed on CS first thing in the capture (a free node of the
 * graph: the graph's work may use it until its first launch has run); after the capture 4 MiB
 * is allocated on CS, on S and with cudaMalloc, and none may get its bytes ("overlap" is 1 when
 * one does).
 * With "capped" (run under a cap the 64 MiB request exceeds) the 64 MiB request must get
 * cudaErrorMemoryAllocation (2), what a capped allocation gets, with the capture left valid.
 * Output: one line
 * "capture_graph: small=RC big=RC end=RC overlap=0|1 launches=RC used=N reserved=N".
 * Exit 1 when the 64 MiB request did not get what it must or on an overlap, 2 on any other
 * failure.
 */
#include <string.h>

#define PROG "capture_graph"
#include "pool_workload.h"

int main(int argc, char **argv) {
    const char *usage = "usage: capture_graph global|local inside|outside [capped] [prefree]\n";
    if (argc < 3 || argc > 5) {
        fprintf(stderr, "%s", usage);
        return 2;
    }
    enum cudaStreamCaptureMode mode;
    if (strcmp(argv[1], "global") == 0)
        mode = cudaStreamCaptureModeGlobal;
    else if (strcmp(argv[1], "local") == 0)
        mode = cudaStreamCaptureModeThreadLocal;
    else {
        fprintf(stderr, "%s", usage);
        return 2;
    }
    int inside = strcmp(argv[2], "inside") == 0;
    if (!inside && strcmp(argv[2], "outside") != 0) {
        fprintf(stderr, "%s", usage);
        return 2;
    }
    int capped = 0, prefree = 0;
    for (int i = 3; i < argc; i++) {
        if (strcmp(argv[i], "capped") == 0 && !capped)
            capped = 1;
        else if (strcmp(argv[i], "prefree") == 0 && !prefree)
            prefree = 1;
        else {
            fprintf(stderr, "%s", usage);
            return 2;
        }
    }
    cudaStream_t cs, s;
    CHECK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    void *w = NULL;
    CHECK(cudaMalloc(&w, 4 << 20));
    CHECK(cudaFree(w));
    CHECK(cudaDeviceSynchronize());

    void *pre = NULL;
    if (prefree) {
        CHECK(cudaMallocAsync(&pre, 4 << 20, cs));
        CHECK(vramsimKernelFill(pre, 0x33, 4 << 20, 0, cs));
    }

    void *small = NULL, *big = NULL;
    CHECK(cudaStreamBeginCapture(cs, mode));
    if (prefree) CHECK(cudaFreeAsync(pre, cs));
    cudaError_t small_rc = cudaMallocAsync(&small, 4 << 20, cs);
    if (small_rc == cudaSuccess) CHECK(vramsimKernelFill(small, 0x11, 4 << 20, 0, cs));
    cudaError_t big_rc = cudaMallocAsync(&big, 64 << 20, cs);
    if (big_rc == cudaSuccess) {
        CHECK(vramsimKernelFill(big, 0x22, 64 << 20, 0, cs));
        if (inside) CHECK(cudaFreeAsync(big, cs));
    }
    if (small_rc == cudaSuccess) CHECK(cudaFreeAsync(small, cs));
    cudaGraph_t g = NULL;
    cudaError_t end_rc = cudaStreamEndCapture(cs, &g);
    void *eager = NULL;
    CHECK(cudaMallocAsync(&eager, 4 << 20, cs));
    int overlap = small_rc == cudaSuccess && (char *)eager < (char *)small + (4 << 20) &&
                  (char *)small < (char *)eager + (4 << 20);
    if (prefree) {
        void *on_s = NULL, *sync = NULL;
        CHECK(cudaMallocAsync(&on_s, 4 << 20, s));
        CHECK(cudaMalloc(&sync, 4 << 20));
        void *got[3] = {eager, on_s, sync};
        for (int i = 0; i < 3; i++)
            if ((char *)got[i] < (char *)pre + (4 << 20) && (char *)pre < (char *)got[i] + (4 << 20))
                overlap = 1;
        CHECK(cudaFreeAsync(on_s, s));
        CHECK(cudaFree(sync));
    }
    CHECK(cudaFreeAsync(eager, cs));

    cudaError_t launches = cudaSuccess;
    if (end_rc == cudaSuccess) {
        cudaGraphExec_t e = NULL;
        CHECK(cudaGraphInstantiate(&e, g, 0));
        for (int i = 0; i < 2; i++) {
            cudaError_t rc = cudaGraphLaunch(e, s);
            if (rc != cudaSuccess && launches == cudaSuccess) launches = rc;
            CHECK(cudaStreamSynchronize(s));
            if (!inside && big_rc == cudaSuccess && rc == cudaSuccess) {
                if (i == 0)
                    CHECK(cudaFreeAsync(big, s));
                else
                    CHECK(cudaFree(big));
                CHECK(cudaStreamSynchronize(s));
            }
        }
        CHECK(cudaGraphExecDestroy(e));
        CHECK(cudaGraphDestroy(g));
    }
    unsigned long long used = 99, reserved = 99;
    CHECK(cudaDeviceGetGraphMemAttribute(0, 0, &used));
    CHECK(cudaDeviceGetGraphMemAttribute(0, 2, &reserved));
    CHECK(cudaDeviceSynchronize());
    if (!capped) {
        void *after = NULL;
        CHECK(cudaMalloc(&after, 64 << 20));
        CHECK(cudaFree(after));
    }
    CHECK(cudaStreamDestroy(cs));
    CHECK(cudaStreamDestroy(s));
    printf(PROG ": small=%d big=%d end=%d overlap=%d launches=%d used=%llu reserved=%llu\n",
           (int)small_rc, (int)big_rc, (int)end_rc, overlap, (int)launches, used, reserved);
    if (big_rc != (capped ? cudaErrorMemoryAllocation : cudaSuccess) || overlap) return 1;
    if (small_rc != cudaSuccess || end_rc != cudaSuccess || launches != cudaSuccess || used != 0 ||
        reserved != 0)
        return 2;
    return 0;
}
