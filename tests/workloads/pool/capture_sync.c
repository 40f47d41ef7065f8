/*
 * capture_sync - while the main thread holds a stream capture, a worker thread makes the
 * library want a device synchronization: the library must not make it. The CUDA driver
 * refuses a cuCtxSynchronize while any capture is under way in the context, whatever the
 * capture's mode, the caller's mode and thread, and invalidates every such capture (its end
 * then fails with 901 and no graph): tests/workloads/sim/driver_facts.expected, `ctx_sync`.
 *
 *   capture_sync pool|fenced|settle CAPTURE_MODE WORKER_MODE
 *
 * CAPTURE_MODE, WORKER_MODE: global|local|relaxed (the capture's mode; the worker's
 * interaction mode, cudaThreadExchangeStreamCaptureMode). The main thread begins capturing a
 * non-blocking stream SA (cudaStreamBeginCapture), captures a memset into it (no call of
 * cuda-sim's own: the workload also runs on a real GPU), starts the worker
 * and waits for it, then ends the capture.
 * - pool (run with VRAMSHIM_POOL=stitch): the worker's cudaMalloc of 64 MiB, its cudaFree (the
 *   block waits for a synchronization before the pool may hand it out again), and a second
 *   cudaMalloc of 64 MiB: the pool would synchronize to take the first block back; during the
 *   capture it grows instead.
 * - fenced (run with VRAMSHIM_POOL=stitch): the worker's cudaMallocAsync of 64 MiB on its
 *   stream WS, its cudaFreeAsync there (the bytes are the pool's again, but a request on no
 *   stream may take them only after a synchronization: WS may still use them), and a
 *   cudaMalloc of 64 MiB: the pool would synchronize to take those bytes; during the capture
 *   it grows instead where the device (and the cap) leave room, else it refuses the request
 *   (cudaErrorMemoryAllocation).
 * - settle (run under a cap of 48 MiB without the pool): the driver's default pool keeps every
 *   freed block (release threshold UINT64_MAX); the worker allocates 40 MiB stream-ordered on
 *   its stream WS and frees it there, then asks for 40 MiB more there: the cap would empty
 *   the driver's pools (a synchronization) before refusing it; during the capture it refuses
 *   it (cudaErrorMemoryAllocation) instead.
 * After the capture's end the worker's last request is made again (the pool's 64 MiB, the
 * 40 MiB on WS), and must succeed.
 * Output: one line "capture_sync: during=RC after=RC end=RC graph=0|1 syncs=N" (during: the
 * worker's last request's result during the capture; after: the same request's after it;
 * end: the end-capture result, 0 when the capture stayed valid, 901 when it was invalidated;
 * graph: whether the end returned a graph; syncs: the pool's synchronizations, -1 without the
 * pool). Exit 1 if the capture ended invalid or without a graph, else 2 on any other failure.
 */
#include <pthread.h>
#include <string.h>

#define PROG "capture_sync"
#include "pool_workload.h"

static int mode_of(const char *m) {
    if (strcmp(m, "global") == 0) return cudaStreamCaptureModeGlobal;
    if (strcmp(m, "local") == 0) return cudaStreamCaptureModeThreadLocal;
    if (strcmp(m, "relaxed") == 0) return cudaStreamCaptureModeRelaxed;
    return -1;
}

static int settle, fenced, worker_mode;
static cudaStream_t ws;
static cudaError_t during = (cudaError_t)-1;
static void *first, *second;

static void *work(void *arg) {
    (void)arg;
    enum cudaStreamCaptureMode m = (enum cudaStreamCaptureMode)worker_mode;
    CHECK(cudaThreadExchangeStreamCaptureMode(&m));
    if (settle) {
        CHECK(cudaMallocAsync(&first, 40 << 20, ws));
        CHECK(cudaFreeAsync(first, ws));
        during = cudaMallocAsync(&second, 40 << 20, ws);
        if (during == cudaSuccess) CHECK(cudaFreeAsync(second, ws));
    } else {
        if (fenced) {
            CHECK(cudaMallocAsync(&first, 64 << 20, ws));
            CHECK(cudaFreeAsync(first, ws));
        } else {
            CHECK(cudaMalloc(&first, 64 << 20));
            CHECK(cudaFree(first));
        }
        during = cudaMalloc(&second, 64 << 20);
        if (during == cudaSuccess) CHECK(cudaFree(second));
    }
    /* back to the mode it had */
    CHECK(cudaThreadExchangeStreamCaptureMode(&m));
    return NULL;
}

int main(int argc, char **argv) {
    const char *usage =
        "usage: capture_sync pool|fenced|settle global|local|relaxed global|local|relaxed\n";
    if (argc != 4 || (strcmp(argv[1], "pool") != 0 && strcmp(argv[1], "fenced") != 0 &&
                      strcmp(argv[1], "settle") != 0)) {
        fprintf(stderr, "%s", usage);
        return 2;
    }
    settle = strcmp(argv[1], "settle") == 0;
    fenced = strcmp(argv[1], "fenced") == 0;
    int capture_mode = mode_of(argv[2]);
    worker_mode = mode_of(argv[3]);
    if (capture_mode < 0 || worker_mode < 0) {
        fprintf(stderr, "%s", usage);
        return 2;
    }
    stat_fn stat = (stat_fn)dlsym(RTLD_DEFAULT, "vramshim_pool_stat");
    CHECK(cudaSetDevice(0));
    cudaStream_t sa;
    CHECK(cudaStreamCreateWithFlags(&sa, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&ws, cudaStreamNonBlocking));
    if (settle) {
        cudaMemPool_t mp;
        CHECK(cudaDeviceGetDefaultMemPool(&mp, 0));
        unsigned long long keep = ~0ull;
        CHECK(cudaMemPoolSetAttribute(mp, cudaMemPoolAttrReleaseThreshold, &keep));
    }
    void *anchor = NULL;
    CHECK(cudaMalloc(&anchor, 4096));
    CHECK(cudaDeviceSynchronize());
    long long syncs_before = stat ? stat(0, "syncs") : -1;

    CHECK(cudaStreamBeginCapture(sa, (enum cudaStreamCaptureMode)capture_mode));
    CHECK(cudaMemsetAsync(anchor, 0x11, 4096, sa));
    pthread_t t;
    if (pthread_create(&t, NULL, work, NULL) != 0) {
        fprintf(stderr, PROG ": pthread_create failed\n");
        return 2;
    }
    pthread_join(t, NULL);
    long long syncs = stat ? stat(0, "syncs") - syncs_before : -1;
    cudaGraph_t g = NULL;
    int end_rc = (int)cudaStreamEndCapture(sa, &g);
    int graph = g != NULL;
    if (g) CHECK(cudaGraphDestroy(g));

    CHECK(cudaDeviceSynchronize());
    cudaError_t after;
    void *p = NULL;
    if (settle) {
        after = cudaMallocAsync(&p, 40 << 20, ws);
        if (after == cudaSuccess) CHECK(cudaFreeAsync(p, ws));
        CHECK(cudaStreamSynchronize(ws));
    } else {
        after = cudaMalloc(&p, 64 << 20);
        if (after == cudaSuccess) CHECK(cudaFree(p));
    }
    CHECK(cudaFree(anchor));
    CHECK(cudaStreamDestroy(sa));
    CHECK(cudaStreamDestroy(ws));
    printf(PROG ": during=%d after=%d end=%d graph=%d syncs=%lld\n", (int)during, (int)after,
           end_rc, graph, syncs);
    if (end_rc != 0 || !graph) return 1;
    return after == cudaSuccess ? 0 : 2;
}
