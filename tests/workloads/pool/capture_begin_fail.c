/*
 * capture_begin_fail - a begin-capture call that fails must be no capture to the pool's
 * requests on other threads while it runs; one that succeeds must be one. Run with
 * VRAMSIM_PAUSE_IN=cuStreamBeginCapture (cuda-sim stops the first begin-capture call on entry
 * until released).
 *
 *   capture_begin_fail runtime|driver legacy|stream
 *
 * After a 64 MiB cudaMalloc and cudaFree (the pool holds the 64 MiB, to be handed out again
 * after a synchronization), thread B begins a global-mode capture (runtime:
 * cudaStreamBeginCapture; driver: cuStreamBeginCapture_v2 from dlsym) of the legacy stream
 * (which cannot capture: the begin fails) or of stream SA (it succeeds), and stops inside the
 * real call. Then a worker thread (global mode) asks cudaMalloc for 64 MiB: the pool
 * synchronizes to take back the 64 MiB freed, which no capture allows (the driver refuses a
 * synchronization during any capture and invalidates it), or grows. The main thread waits up
 * to 500 ms for the worker's request to return, then lets B's begin go on; B ends its capture
 * if it began.
 * Output: one line "capture_begin_fail: begin=RC worker=RC worker_first=0|1 syncs=N end=RC"
 * (worker_first: the worker's request returned while B's begin was stopped; syncs: the pool's
 * synchronizations during the worker's request). The worker must get 0; with "legacy" the pool
 * must have synchronized (syncs >= 1: no capture ever began; the request waits for the begin's
 * outcome, or decides without it); with "stream" not (syncs 0), and B's end must be 0 (the
 * capture stayed valid). Exit 1 when a value is not that, 2 on any other failure.
 */
#include <pthread.h>
#include <string.h>
#include <time.h>

#define PROG "capture_begin_fail"
#include "pool_workload.h"

typedef CUresult (*begin_fn)(CUstream, int);
typedef CUresult (*end_fn)(CUstream, void **);
typedef CUresult (*pause_wait_fn)(unsigned int);
typedef CUresult (*pause_release_fn)(void);

static cudaStream_t target;
static begin_fn begin;
static end_fn end;
static cudaError_t worker_rc = (cudaError_t)-1;
static int begin_rc = -1, end_rc = -1;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int worker_done;
static long long syncs = -1;

static void *worker(void *arg) {
    (void)arg;
    void *big = NULL;
    stat_fn stat = pool_stat_or_exit();
    long long before = stat(0, "syncs");
    cudaError_t rc = cudaMalloc(&big, 64 << 20);
    long long after = stat(0, "syncs");
    if (rc == cudaSuccess) CHECK(cudaFree(big));
    pthread_mutex_lock(&mu);
    syncs = after - before;
    worker_rc = rc;
    worker_done = 1;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    return NULL;
}

static void *capturer(void *arg) {
    (void)arg;
    begin_rc = begin ? (int)begin((CUstream)target, cudaStreamCaptureModeGlobal)
                     : (int)cudaStreamBeginCapture(target, cudaStreamCaptureModeGlobal);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 3 || (strcmp(argv[1], "runtime") != 0 && strcmp(argv[1], "driver") != 0) ||
        (strcmp(argv[2], "legacy") != 0 && strcmp(argv[2], "stream") != 0)) {
        fprintf(stderr, "usage: capture_begin_fail runtime|driver legacy|stream\n");
        return 2;
    }
    int legacy = strcmp(argv[2], "legacy") == 0;
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
    cudaStream_t sa;
    CHECK(cudaStreamCreateWithFlags(&sa, cudaStreamNonBlocking));
    target = legacy ? (cudaStream_t)0 : sa;
    void *w = NULL;
    CHECK(cudaMalloc(&w, 64 << 20));
    CHECK(cudaFree(w));

    pthread_t b, wt;
    if (pthread_create(&b, NULL, capturer, NULL) != 0) return 2;
    if (pause_wait(10000) != CUDA_SUCCESS) {
        fprintf(stderr, PROG ": the begin never stopped (VRAMSIM_PAUSE_IN?)\n");
        return 2;
    }
    if (pthread_create(&wt, NULL, worker, NULL) != 0) return 2;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += 500 * 1000 * 1000;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&mu);
    while (!worker_done && pthread_cond_timedwait(&cv, &mu, &until) == 0) {
    }
    int worker_first = worker_done;
    pthread_mutex_unlock(&mu);
    pause_release();
    pthread_join(b, NULL);
    pthread_join(wt, NULL);
    if (begin_rc == 0) {
        cudaGraph_t g = NULL;
        end_rc = end ? (int)end((CUstream)target, (void **)&g) : (int)cudaStreamEndCapture(target, &g);
        if (end_rc == 0 && g) CHECK(cudaGraphDestroy(g));
    }
    CHECK(cudaStreamDestroy(sa));
    printf(PROG ": begin=%d worker=%d worker_first=%d syncs=%lld end=%d\n", begin_rc, (int)worker_rc,
           worker_first, syncs, end_rc);
    if (legacy) {
        if (begin_rc == 0) return 2;
        return worker_rc == cudaSuccess && syncs >= 1 ? 0 : 1;
    }
    if (begin_rc != 0) return 2;
    return worker_rc == cudaSuccess && syncs == 0 && end_rc == 0 ? 0 : 1;
}
