/*
 * capture_window - a capture another thread begins while the pool serves a request: the
 * request decided that no capture forbids its calls, and must not make one after the capture
 * began. Run with VRAMSIM_PAUSE_IN=cuMemCreate (cuda-sim stops the first cuMemCreate on entry
 * until released).
 *
 *   capture_window runtime|driver [oom|settle|sync]
 *
 * With "sync" (run under VRAMSIM_PAUSE_IN=cuCtxSynchronize) the worker first allocates 64 MiB
 * with cudaMalloc and frees it (the pool keeps it, to be handed out again after a
 * synchronization), then asks for 64 MiB again: the pool synchronizes, after it decided under
 * its lock that no capture is under way; that cuCtxSynchronize stops in the driver, and B
 * begins its capture then. The worker must get 0.
 * With "oom" (run under VRAMSIM_MEMORY smaller than 64 MiB and VRAMSIM_PAUSE_IN=cuMemAlloc) the
 * pool cannot grow: it refuses the request, and the library asks the runtime for an allocation
 * no device can satisfy (cudaMalloc(SIZE_MAX), so that the runtime's last error says out of
 * memory) after it decided no capture forbids that call; the runtime's cuMemAlloc stops in
 * the driver, and B begins its capture then. The worker must get
 * cudaErrorMemoryAllocation (2).
 * With "settle" (run under a 48 MiB cap without the pool, VRAMSIM_PAUSE_IN=cuCtxSynchronize) the
 * driver's default pool keeps every freed block (release threshold UINT64_MAX): the worker
 * allocates 40 MiB stream-ordered on its stream and frees it there, then asks for 40 MiB more
 * there (cudaMallocAsync, which no capture forbids), which the cap would refuse while the
 * driver's pool caches the first 40: the cap
 * empties the driver's pools, after it decided no capture forbids the synchronization that
 * takes; that cuCtxSynchronize stops in the driver, and B begins its capture then. The worker
 * must get 0.
 * A worker thread (global mode) asks cudaMalloc for 64 MiB: the pool grows, and its first
 * cuMemCreate stops in the driver, the pool's lock held. Then thread B begins capturing stream
 * SA in global mode (runtime: cudaStreamBeginCapture; driver: cuStreamBeginCapture_v2 from
 * dlsym). The main thread waits up to 300 ms for B's begin to return, then lets the worker's
 * call go on; the worker's request completes (or fails), and B ends its capture.
 * Output: one line "capture_window: worker=RC begun_first=0|1 end=RC" (worker: the 64 MiB
 * request's result; begun_first: B's begin returned while the worker's call was stopped;
 * end: B's end-capture result, 0 when the capture stayed valid, 901 when the pool's call
 * invalidated it). Exit 1 if the capture ended invalid, else 2 on any other failure.
 */
#include <pthread.h>
#include <string.h>
#include <time.h>

#define PROG "capture_window"
#include "pool_workload.h"

typedef CUresult (*begin_fn)(CUstream, int);
typedef CUresult (*end_fn)(CUstream, void **);
typedef CUresult (*pause_wait_fn)(unsigned int);
typedef CUresult (*pause_release_fn)(void);

static cudaStream_t sa;
static begin_fn begin;
static end_fn end;
static cudaError_t worker_rc = (cudaError_t)-1;
static int begin_rc = -1, end_rc = -1;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int begun, may_end;

static int settle, sync_first;
static cudaStream_t ws;

static void *worker(void *arg) {
    (void)arg;
    void *big = NULL;
    if (settle) {
        void *a = NULL;
        CHECK(cudaMallocAsync(&a, 40 << 20, ws));
        CHECK(cudaFreeAsync(a, ws));
        /* stream-ordered: an allocation a capture does not forbid */
        worker_rc = cudaMallocAsync(&big, 40 << 20, ws);
        if (worker_rc == cudaSuccess) CHECK(cudaFreeAsync(big, ws));
        return NULL;
    }
    if (sync_first) {
        CHECK(cudaMalloc(&big, 64 << 20));
        CHECK(cudaFree(big));
    }
    worker_rc = cudaMalloc(&big, 64 << 20);
    if (worker_rc == cudaSuccess) CHECK(cudaFree(big));
    return NULL;
}

static void *capturer(void *arg) {
    (void)arg;
    int rc = begin ? (int)begin((CUstream)sa, cudaStreamCaptureModeGlobal)
                   : (int)cudaStreamBeginCapture(sa, cudaStreamCaptureModeGlobal);
    pthread_mutex_lock(&mu);
    begin_rc = rc;
    begun = 1;
    pthread_cond_broadcast(&cv);
    while (!may_end) pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
    if (rc == 0) {
        cudaGraph_t g = NULL;
        end_rc = end ? (int)end((CUstream)sa, (void **)&g) : (int)cudaStreamEndCapture(sa, &g);
        if (end_rc == 0 && g) CHECK(cudaGraphDestroy(g));
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2 || argc > 3 || (strcmp(argv[1], "runtime") != 0 && strcmp(argv[1], "driver") != 0) ||
        (argc == 3 && strcmp(argv[2], "oom") != 0 && strcmp(argv[2], "settle") != 0 &&
         strcmp(argv[2], "sync") != 0)) {
        fprintf(stderr, "usage: capture_window runtime|driver [oom|settle|sync]\n");
        return 2;
    }
    int oom = argc == 3 && strcmp(argv[2], "oom") == 0;
    settle = argc == 3 && strcmp(argv[2], "settle") == 0;
    sync_first = argc == 3 && strcmp(argv[2], "sync") == 0;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    pause_wait_fn pause_wait = lib ? (pause_wait_fn)dlsym(lib, "vramsimPauseWait") : NULL;
    pause_release_fn pause_release = lib ? (pause_release_fn)dlsym(lib, "vramsimPauseRelease") : NULL;
    if (!pause_wait || !pause_release) {
        fprintf(stderr, PROG ": no pause point (cuda-sim only)\n");
        return 2;
    }
    if (strcmp(argv[1], "driver") == 0) {
        begin = (begin_fn)dlsym(lib, "cuStreamBeginCapture_v2");
        end = (end_fn)dlsym(lib, "cuStreamEndCapture");
        if (!begin || !end) {
            fprintf(stderr, PROG ": no capture entry points\n");
            return 2;
        }
    }
    CHECK(cudaSetDevice(0));
    CHECK(cudaStreamCreateWithFlags(&sa, cudaStreamNonBlocking));
    if (settle) {
        CHECK(cudaStreamCreateWithFlags(&ws, cudaStreamNonBlocking));
        cudaMemPool_t mp;
        CHECK(cudaDeviceGetDefaultMemPool(&mp, 0));
        unsigned long long keep = ~0ull;
        CHECK(cudaMemPoolSetAttribute(mp, cudaMemPoolAttrReleaseThreshold, &keep));
    }

    pthread_t w, b;
    if (pthread_create(&w, NULL, worker, NULL) != 0) return 2;
    if (pause_wait(10000) != CUDA_SUCCESS) {
        fprintf(stderr, PROG ": the worker's call never stopped (VRAMSIM_PAUSE_IN?)\n");
        return 2;
    }
    if (pthread_create(&b, NULL, capturer, NULL) != 0) return 2;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += 300 * 1000 * 1000;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&mu);
    while (!begun && pthread_cond_timedwait(&cv, &mu, &until) == 0) {
    }
    int begun_first = begun;
    pthread_mutex_unlock(&mu);
    pause_release();
    pthread_join(w, NULL);
    pthread_mutex_lock(&mu);
    may_end = 1;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    pthread_join(b, NULL);
    CHECK(cudaStreamDestroy(sa));
    printf(PROG ": worker=%d begun_first=%d end=%d\n", (int)worker_rc, begun_first, end_rc);
    if (begin_rc != 0) {
        fprintf(stderr, PROG ": begin failed: %d\n", begin_rc);
        return 2;
    }
    if (end_rc != 0) return 1;
    return worker_rc == (oom ? cudaErrorMemoryAllocation : cudaSuccess) ? 0 : 2;
}
