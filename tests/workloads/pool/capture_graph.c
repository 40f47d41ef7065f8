/*
 * capture_graph - a graph allocation through the pool: during a stream capture a
 * cudaMallocAsync on the capturing stream for more than the pool holds must succeed, as it
 * does without the library: CUDA makes it an allocation node of the graph (the library sends
 * every stream-ordered request on a capturing stream to the driver). The graph is instantiated and launched, and the
 * allocation freed.
 *
 *   capture_graph global|local inside|outside [capped] [prefree|prefree-malloc] [joined]
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
 * With "prefree" (or "prefree-malloc") a 4 MiB block is allocated on CS before the capture
 * with cudaMallocAsync (with cudaMalloc) and filled, and freed on CS first thing in the
 * capture (cudaFreeAsync): memory no allocation node of the graph returned, which CUDA refuses
 * in a capture (a free node takes only a graph allocation); its code is "prefree", and the
 * capture's status just before its end (cudaStreamIsCapturing: 0 none, 1 active, 2
 * invalidated) is "status". After the capture 4 MiB is allocated on CS, on S and with
 * cudaMalloc, and none may get its bytes ("overlap" is 1 when one does): the block is still the
 * program's when the free failed, and the graph's until its first launch has run had it
 * succeeded; it is then freed (cudaFreeAsync on CS) when its free in the capture failed.
 * Every free in the capture is checked the same way: the first code that is not success is
 * "frees", and a block whose free failed is freed after the capture; the first of those later
 * frees that fails gives "later" (0: none failed).
 * With "joined" everything said of CS from the capture's beginning to its end (and the 4 MiB
 * allocated after it, and the "prefree" block's allocation, fill and free after the capture) is
 * done on stream J instead, which joins CS's capture by waiting on an event recorded on CS
 * first thing in the capture (its work is captured into CS's graph: CUDA's cross-stream
 * capture), and CS waits on an event recorded on J before the end (J rejoins CS). J must
 * report the capture active once it waited and none after the end ("joined" is 1 then).
 * With "capped" (run under a cap the 64 MiB request exceeds) the 64 MiB request must get
 * cudaErrorMemoryAllocation (2), what a capped allocation gets, with the capture left valid.
 * Output: one line
 * "capture_graph: small=RC big=RC end=RC overlap=0|1 launches=RC used=N reserved=N prefree=RC
 * status=N frees=RC later=RC joined=0|1" (prefree=-1 without "prefree"; status is J's with
 * "joined").
 * Exit 1 on an overlap or a later free that fails, and without "prefree" when the 64 MiB
 * request did not get what it must; 2 on any other failure (with "prefree" the capture's codes
 * are reported, not judged: they are CUDA's answer to the free).
 */
#include <string.h>

#define PROG "capture_graph"
#include "pool_workload.h"

int main(int argc, char **argv) {
    const char *usage =
        "usage: capture_graph global|local inside|outside [capped] [prefree|prefree-malloc] "
        "[joined]\n";
    if (argc < 3 || argc > 6) {
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
    int capped = 0, prefree = 0, join = 0;
    for (int i = 3; i < argc; i++) {
        if (strcmp(argv[i], "capped") == 0 && !capped)
            capped = 1;
        else if (strcmp(argv[i], "prefree") == 0 && !prefree)
            prefree = 1;
        else if (strcmp(argv[i], "prefree-malloc") == 0 && !prefree)
            prefree = 2;
        else if (strcmp(argv[i], "joined") == 0 && !join)
            join = 1;
        else {
            fprintf(stderr, "%s", usage);
            return 2;
        }
    }
    cudaStream_t cs, s, j;
    CHECK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&j, cudaStreamNonBlocking));
    cudaEvent_t fork, rejoin;
    CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    CHECK(cudaEventCreateWithFlags(&rejoin, cudaEventDisableTiming));
    /* the stream the capture's work goes on */
    cudaStream_t on = join ? j : cs;
    void *w = NULL;
    CHECK(cudaMalloc(&w, 4 << 20));
    CHECK(cudaFree(w));
    CHECK(cudaDeviceSynchronize());

    void *pre = NULL;
    if (prefree == 1) CHECK(cudaMallocAsync(&pre, 4 << 20, on));
    if (prefree == 2) CHECK(cudaMalloc(&pre, 4 << 20));
    if (prefree) CHECK(vramsimKernelFill(pre, 0x33, 4 << 20, 0, on));

    void *small = NULL, *big = NULL;
    /* -1: not freed in the capture */
    cudaError_t pre_rc = (cudaError_t)-1, small_free = (cudaError_t)-1, big_free = (cudaError_t)-1;
    int joined = 0;
    CHECK(cudaStreamBeginCapture(cs, mode));
    if (join) {
        enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
        CHECK(cudaEventRecord(fork, cs));
        CHECK(cudaStreamWaitEvent(j, fork, 0));
        CHECK(cudaStreamIsCapturing(j, &st));
        joined = st == cudaStreamCaptureStatusActive;
    }
    if (prefree) pre_rc = cudaFreeAsync(pre, on);
    cudaError_t small_rc = cudaMallocAsync(&small, 4 << 20, on);
    if (small_rc == cudaSuccess) CHECK(vramsimKernelFill(small, 0x11, 4 << 20, 0, on));
    cudaError_t big_rc = cudaMallocAsync(&big, 64 << 20, on);
    if (big_rc == cudaSuccess) {
        CHECK(vramsimKernelFill(big, 0x22, 64 << 20, 0, on));
        if (inside) big_free = cudaFreeAsync(big, on);
    }
    if (small_rc == cudaSuccess) small_free = cudaFreeAsync(small, on);
    enum cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    CHECK(cudaStreamIsCapturing(on, &status));
    /* J rejoins CS (a wait a capture that was invalidated refuses: not checked) */
    if (join && cudaEventRecord(rejoin, j) == cudaSuccess) (void)cudaStreamWaitEvent(cs, rejoin, 0);
    cudaError_t frees_rc = cudaSuccess;
    cudaError_t tried[3] = {pre_rc, small_free, big_free};
    for (int i = 0; i < 3; i++)
        if (frees_rc == cudaSuccess && tried[i] != (cudaError_t)-1 && tried[i] != cudaSuccess)
            frees_rc = tried[i];
    cudaGraph_t g = NULL;
    cudaError_t end_rc = cudaStreamEndCapture(cs, &g);
    if (join) {
        enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusActive;
        CHECK(cudaStreamIsCapturing(j, &st));
        if (st != cudaStreamCaptureStatusNone) joined = 0;
    }
    void *eager = NULL;
    CHECK(cudaMallocAsync(&eager, 4 << 20, on));
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
    CHECK(cudaFreeAsync(eager, on));
    /* the blocks whose free the capture refused are still the program's */
    cudaError_t later_rc = cudaSuccess;
    void *refused[3] = {pre, small, big};
    for (int i = 0; i < 3; i++) {
        if (tried[i] == (cudaError_t)-1 || tried[i] == cudaSuccess) continue;
        cudaError_t rc = cudaFreeAsync(refused[i], on);
        if (rc != cudaSuccess && later_rc == cudaSuccess) later_rc = rc;
    }
    CHECK(cudaStreamSynchronize(on));

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
    CHECK(cudaEventDestroy(fork));
    CHECK(cudaEventDestroy(rejoin));
    CHECK(cudaStreamDestroy(cs));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaStreamDestroy(j));
    printf(PROG ": small=%d big=%d end=%d overlap=%d launches=%d used=%llu reserved=%llu "
                "prefree=%d status=%d frees=%d later=%d joined=%d\n",
           (int)small_rc, (int)big_rc, (int)end_rc, overlap, (int)launches, used, reserved,
           (int)pre_rc, (int)status, (int)frees_rc, (int)later_rc, joined);
    if (joined != join) return 2;
    if (overlap || later_rc != cudaSuccess) return 1;
    if (!prefree && big_rc != (capped ? cudaErrorMemoryAllocation : cudaSuccess)) return 1;
    if (used != 0 || reserved != 0) return 2;
    if (prefree) return 0;
    if (small_rc != cudaSuccess || end_rc != cudaSuccess || launches != cudaSuccess ||
        frees_rc != cudaSuccess)
        return 2;
    return 0;
}
