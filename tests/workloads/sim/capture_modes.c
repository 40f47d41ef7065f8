/* capture_modes: which threads a capture forbids potentially unsafe calls, by the calling
 * thread's interaction mode (CUDA's rules of cudaThreadExchangeStreamCaptureMode), the
 * virtual-memory calls, which no capture forbids, stream-ordered allocations and frees on a
 * stream that does not capture and pool trims, which are among those calls, and
 * cudaDeviceSynchronize, which every capture forbids; the legacy stream while a blocking stream captures
 * (cudaErrorStreamCaptureImplicit); waits of and on capturing streams (an event recorded outside
 * the capture: cudaErrorStreamCaptureIsolation unless cudaEventWaitExternal; a stream that waits
 * on an event recorded in a capture joins that capture until it ends, and an event recorded in a
 * capture that has ended cannot be waited on: cudaErrorInvalidValue); a fork never joined back
 * (cudaErrorStreamCaptureUnjoined at the end) and a wait that would merge two captures
 * (cudaErrorStreamCaptureMerge, both invalidated), as a real driver answers. Prints
 * "capture_modes: ok". */
#include <dlfcn.h>
#include <pthread.h>
#include "check.h"

typedef CUresult (*reserve_fn)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
typedef CUresult (*free_fn)(CUdeviceptr, size_t);
typedef CUresult (*info_fn)(CUstream, int *, unsigned long long *);
static reserve_fn reserve;
static free_fn unreserve;
static info_fn capture_info;

/* The driver's capture status and id of `s`. */
static int status_of(cudaStream_t s, unsigned long long *id) {
    int st = -1;
    *id = 0;
    EXPECT(capture_info((CUstream)s, &st, id) == CUDA_SUCCESS);
    return st;
}

static enum cudaStreamCaptureMode worker_mode;
static cudaError_t worker_got;

/* cudaMalloc in worker_mode on a thread of its own. */
static void *worker(void *arg) {
    (void)arg;
    enum cudaStreamCaptureMode m = worker_mode;
    CK(cudaThreadExchangeStreamCaptureMode(&m));
    void *p = NULL;
    worker_got = cudaMalloc(&p, 1 << 20);
    if (worker_got == cudaSuccess) CK(cudaFree(p));
    CK(cudaThreadExchangeStreamCaptureMode(&m));
    return NULL;
}

/* Capture s in `capture`, a worker in `worker` mode allocates: its result and the end's. */
static void case_(cudaStream_t s, enum cudaStreamCaptureMode capture, enum cudaStreamCaptureMode w,
                  cudaError_t want_worker, cudaError_t want_end) {
    cudaGraph_t g = NULL;
    CK(cudaStreamBeginCapture(s, capture));
    worker_mode = w;
    pthread_t t;
    EXPECT(pthread_create(&t, NULL, worker, NULL) == 0);
    pthread_join(t, NULL);
    EXPECT_EQ(worker_got, want_worker);
    EXPECT_EQ(cudaStreamEndCapture(s, &g), want_end);
}

int main(void) {
    CK(cudaSetDevice(0));
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    EXPECT(lib != NULL);
    reserve = (reserve_fn)dlsym(lib, "cuMemAddressReserve");
    unreserve = (free_fn)dlsym(lib, "cuMemAddressFree");
    capture_info = (info_fn)dlsym(lib, "cuStreamGetCaptureInfo");
    EXPECT(reserve && unreserve && capture_info);
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

    /* another thread's global capture forbids a thread in global mode, not one in
     * thread-local or relaxed mode; a thread-local or relaxed capture forbids no other thread */
    case_(s, cudaStreamCaptureModeGlobal, cudaStreamCaptureModeGlobal, cudaErrorStreamCaptureUnsupported,
          cudaErrorStreamCaptureInvalidated);
    case_(s, cudaStreamCaptureModeGlobal, cudaStreamCaptureModeThreadLocal, cudaSuccess, cudaSuccess);
    case_(s, cudaStreamCaptureModeGlobal, cudaStreamCaptureModeRelaxed, cudaSuccess, cudaSuccess);
    case_(s, cudaStreamCaptureModeThreadLocal, cudaStreamCaptureModeGlobal, cudaSuccess, cudaSuccess);
    case_(s, cudaStreamCaptureModeRelaxed, cudaStreamCaptureModeGlobal, cudaSuccess, cudaSuccess);

    /* a virtual-memory call on the capturing thread itself, global and thread-local captures:
     * allowed, the capture untouched (it ends with a graph), where cudaMalloc is refused */
    cudaGraph_t g = NULL;
    CUdeviceptr va = 0;
    unsigned long long id_s = 0, id_other = 0;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    EXPECT_EQ(reserve(&va, 2 << 20, 0, 0, 0), 0);
    EXPECT_EQ(unreserve(va, 2 << 20), 0);
    EXPECT_EQ(status_of(s, &id_s), cudaStreamCaptureStatusActive);
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphDestroy(g));
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    EXPECT_EQ(reserve(&va, 2 << 20, 0, 0, 0), 0);
    EXPECT_EQ(unreserve(va, 2 << 20), 0);
    void *nope = NULL;
    EXPECT_EQ(cudaMalloc(&nope, 1 << 20), cudaErrorStreamCaptureUnsupported);
    EXPECT_EQ(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);

    /* a stream-ordered allocation or free on a stream that does not capture, and a pool trim,
     * act at once: potentially unsafe, refused by this thread's global capture (900, the
     * capture invalidated), let through by a relaxed one */
    cudaStream_t side;
    CK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    void *sa = NULL, *sb = NULL;
    CK(cudaMallocAsync(&sa, 1 << 20, side));
    CK(cudaStreamSynchronize(side));
    cudaMemPool_t pool;
    CK(cudaDeviceGetDefaultMemPool(&pool, 0));
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    EXPECT_EQ(cudaMallocAsync(&sb, 1 << 20, side), cudaErrorStreamCaptureUnsupported);
    EXPECT_EQ(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    EXPECT_EQ(cudaFreeAsync(sa, side), cudaErrorStreamCaptureUnsupported);
    EXPECT_EQ(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    EXPECT_EQ(cudaMemPoolTrimTo(pool, 0), cudaErrorStreamCaptureUnsupported);
    EXPECT_EQ(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    CK(cudaMallocAsync(&sb, 1 << 20, side));
    CK(cudaFreeAsync(sb, side));
    CK(cudaFreeAsync(sa, side));
    CK(cudaMemPoolTrimTo(pool, 0));
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphDestroy(g));
    CK(cudaStreamSynchronize(side));
    CK(cudaStreamDestroy(side));

    /* cudaDeviceSynchronize would wait for the capturing stream itself: refused and the
     * capture invalidated whatever the modes, a relaxed capture included (which lets the same
     * thread's cudaMalloc through) */
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    CK(cudaMalloc(&nope, 1 << 20));
    CK(cudaFree(nope));
    EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorStreamCaptureUnsupported);
    EXPECT_EQ(status_of(s, &id_s), cudaStreamCaptureStatusInvalidated);
    EXPECT_EQ(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);

    /* the legacy stream while a blocking stream captures: any use of it (work, a synchronous
     * call, its synchronization) would depend on the capture: 906, the capture invalidated,
     * whatever the thread's mode; while only a non-blocking stream captures it is free */
    cudaStream_t blocking;
    CK(cudaStreamCreate(&blocking));
    void *d = NULL;
    CK(cudaMalloc(&d, 1 << 20));
    enum cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed;
    CK(cudaThreadExchangeStreamCaptureMode(&m));
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    CK(cudaMemsetAsync(d, 0, 1 << 20, 0));
    CK(cudaStreamSynchronize(0));
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphDestroy(g));
    CK(cudaStreamBeginCapture(blocking, cudaStreamCaptureModeRelaxed));
    EXPECT_EQ(cudaMemsetAsync(d, 0, 1 << 20, 0), cudaErrorStreamCaptureImplicit);
    EXPECT_EQ(cudaStreamEndCapture(blocking, &g), cudaErrorStreamCaptureInvalidated);
    CK(cudaStreamBeginCapture(blocking, cudaStreamCaptureModeRelaxed));
    EXPECT_EQ(cudaStreamSynchronize(0), cudaErrorStreamCaptureImplicit);
    EXPECT_EQ(cudaStreamEndCapture(blocking, &g), cudaErrorStreamCaptureInvalidated);
    CK(cudaStreamBeginCapture(blocking, cudaStreamCaptureModeRelaxed));
    EXPECT_EQ(cudaMemset(d, 0, 1 << 20), cudaErrorStreamCaptureImplicit);
    EXPECT_EQ(cudaStreamEndCapture(blocking, &g), cudaErrorStreamCaptureInvalidated);
    CK(cudaThreadExchangeStreamCaptureMode(&m));

    /* waits: an event recorded outside the capture, waited on by the capturing stream: 905 and
     * the capture invalidated, unless the wait is external (cudaEventWaitExternal, invalid
     * outside capture); an event never recorded is no dependency; an event recorded in the
     * capture joins it: a stream outside the capture that waits on it joins the capture (active,
     * the same id, cannot end it: 903) until the capture ends; the event, last recorded in a
     * capture that ended, cannot be waited on (1) */
    cudaStream_t other;
    CK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
    cudaEvent_t outside, never, inside;
    CK(cudaEventCreate(&outside));
    CK(cudaEventCreate(&never));
    CK(cudaEventCreate(&inside));
    CK(cudaEventRecord(outside, other));
    EXPECT_EQ(cudaStreamWaitEvent(other, outside, 1 /* cudaEventWaitExternal */), cudaErrorInvalidValue);
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CK(cudaStreamWaitEvent(s, never, 0));
    CK(cudaStreamWaitEvent(s, outside, 1 /* cudaEventWaitExternal */));
    CK(cudaEventRecord(inside, s));
    CK(cudaStreamWaitEvent(s, inside, 0));
    EXPECT_EQ(status_of(other, &id_other), cudaStreamCaptureStatusNone);
    CK(cudaStreamWaitEvent(other, inside, 0));
    enum cudaStreamCaptureStatus joined = cudaStreamCaptureStatusNone;
    CK(cudaStreamIsCapturing(other, &joined));
    EXPECT_EQ(joined, cudaStreamCaptureStatusActive);
    EXPECT_EQ(status_of(s, &id_s), cudaStreamCaptureStatusActive);
    EXPECT_EQ(status_of(other, &id_other), cudaStreamCaptureStatusActive);
    EXPECT(id_s != 0 && id_other == id_s);
    EXPECT_EQ(cudaStreamEndCapture(other, &g), cudaErrorStreamCaptureUnmatched);
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphDestroy(g));
    CK(cudaStreamIsCapturing(other, &joined));
    EXPECT_EQ(joined, cudaStreamCaptureStatusNone);
    EXPECT_EQ(cudaStreamWaitEvent(other, inside, 0), cudaErrorInvalidValue);
    /* and waited on in a new capture: refused too, and that capture invalidated */
    CK(cudaStreamBeginCapture(other, cudaStreamCaptureModeGlobal));
    EXPECT_EQ(cudaStreamWaitEvent(other, inside, 0), cudaErrorInvalidValue);
    EXPECT_EQ(status_of(other, &id_other), cudaStreamCaptureStatusInvalidated);
    EXPECT_EQ(cudaStreamEndCapture(other, &g), cudaErrorStreamCaptureInvalidated);
    /* a joined stream's unsafe call invalidates the capture it joined */
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CK(cudaEventRecord(inside, s));
    CK(cudaStreamWaitEvent(other, inside, 0));
    EXPECT_EQ(cudaStreamSynchronize(other), cudaErrorStreamCaptureUnsupported);
    EXPECT_EQ(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
    EXPECT_EQ(status_of(other, &id_other), cudaStreamCaptureStatusNone);
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    EXPECT_EQ(cudaStreamWaitEvent(s, outside, 0), cudaErrorStreamCaptureIsolation);
    EXPECT_EQ(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
    CK(cudaEventRecord(inside, other)); /* recorded outside again: no longer a captured event */
    CK(cudaStreamWaitEvent(other, inside, 0));

    /* a fork must be joined back: the origin waits on an event the forked stream recorded after
     * its captured work. Ended while the forked stream has work the origin does not depend on:
     * 904, no graph, and the capture ends for every stream of it. Joined back, it ends cleanly;
     * work captured after the join is unjoined again; a forked stream that captured nothing
     * needs no join. */
    cudaEvent_t fork, join;
    CK(cudaEventCreate(&fork));
    CK(cudaEventCreate(&join));
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CK(cudaEventRecord(fork, s));
    CK(cudaStreamWaitEvent(other, fork, 0));
    CK(cudaMemsetAsync(d, 0, 1 << 20, other));
    g = NULL;
    EXPECT_EQ(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureUnjoined);
    EXPECT(g == NULL);
    EXPECT_EQ(status_of(s, &id_s), cudaStreamCaptureStatusNone);
    EXPECT_EQ(status_of(other, &id_other), cudaStreamCaptureStatusNone);
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CK(cudaEventRecord(fork, s));
    CK(cudaStreamWaitEvent(other, fork, 0));
    CK(cudaMemsetAsync(d, 0, 1 << 20, other));
    CK(cudaEventRecord(join, other));
    CK(cudaStreamWaitEvent(s, join, 0));
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphDestroy(g));
    EXPECT_EQ(status_of(other, &id_other), cudaStreamCaptureStatusNone);
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CK(cudaEventRecord(fork, s));
    CK(cudaStreamWaitEvent(other, fork, 0));
    CK(cudaEventRecord(join, other));
    CK(cudaStreamWaitEvent(s, join, 0));
    CK(cudaMemsetAsync(d, 0, 1 << 20, other));
    g = NULL;
    EXPECT_EQ(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureUnjoined);
    EXPECT(g == NULL);
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CK(cudaEventRecord(fork, s));
    CK(cudaStreamWaitEvent(other, fork, 0));
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphDestroy(g));

    /* a join relayed through another forked stream joins back too: `relay` forks from `other`,
     * captures work, and `other` waits on it before the origin waits on `other`; the origin then
     * depends on both streams' work (the graph's edges), so the capture ends cleanly */
    cudaStream_t relay;
    cudaEvent_t relayed;
    CK(cudaStreamCreateWithFlags(&relay, cudaStreamNonBlocking));
    CK(cudaEventCreate(&relayed));
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CK(cudaEventRecord(fork, s));
    CK(cudaStreamWaitEvent(other, fork, 0));
    CK(cudaEventRecord(join, other));
    CK(cudaStreamWaitEvent(relay, join, 0));
    CK(cudaMemsetAsync(d, 0, 1 << 20, relay));
    CK(cudaEventRecord(relayed, relay));
    CK(cudaStreamWaitEvent(other, relayed, 0));
    CK(cudaEventRecord(join, other));
    CK(cudaStreamWaitEvent(s, join, 0));
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphDestroy(g));
    EXPECT_EQ(status_of(relay, &id_other), cudaStreamCaptureStatusNone);
    /* relayed, but work the relay captured after the event `other` waited on: unjoined */
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CK(cudaEventRecord(fork, s));
    CK(cudaStreamWaitEvent(relay, fork, 0));
    CK(cudaEventRecord(relayed, relay));
    CK(cudaStreamWaitEvent(other, relayed, 0));
    CK(cudaMemsetAsync(d, 0, 1 << 20, relay));
    CK(cudaEventRecord(join, other));
    CK(cudaStreamWaitEvent(s, join, 0));
    g = NULL;
    EXPECT_EQ(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureUnjoined);
    EXPECT(g == NULL);
    CK(cudaEventDestroy(relayed));
    CK(cudaStreamDestroy(relay));

    /* a stream capturing in one capture may not wait on an event recorded in another (the two
     * would merge): 902, and both captures invalidated, the event's as the waiting stream's */
    cudaStream_t third;
    CK(cudaStreamCreateWithFlags(&third, cudaStreamNonBlocking));
    unsigned long long id_third = 0;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CK(cudaStreamBeginCapture(third, cudaStreamCaptureModeGlobal));
    CK(cudaEventRecord(fork, s));
    EXPECT_EQ(cudaStreamWaitEvent(third, fork, 0), cudaErrorStreamCaptureMerge);
    EXPECT_EQ(status_of(third, &id_third), cudaStreamCaptureStatusInvalidated);
    EXPECT_EQ(status_of(s, &id_s), cudaStreamCaptureStatusInvalidated);
    EXPECT(id_third != id_s);
    EXPECT_EQ(cudaStreamEndCapture(third, &g), cudaErrorStreamCaptureInvalidated);
    EXPECT_EQ(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
    CK(cudaEventDestroy(fork));
    CK(cudaEventDestroy(join));
    CK(cudaStreamDestroy(third));

    CK(cudaFree(d));
    CK(cudaStreamDestroy(blocking));
    CK(cudaStreamDestroy(other));
    CK(cudaStreamDestroy(s));
    printf("capture_modes: ok\n");
    return 0;
}
