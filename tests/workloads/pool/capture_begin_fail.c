/*
 * capture_begin_fail - a begin-capture call that fails must be no capture to the pool's
 * requests on other threads while it runs; one that succeeds must be one. Run with
 * VRAMSIM_PAUSE_IN=cuStreamBeginCapture (cuda-sim stops the first begin-capture call on entry
 * until released).
 *
 *   capture_begin_fail runtime|driver legacy|stream
 *
 * After a 64 MiB cudaMalloc and cudaFree (the pool holds the 64 MiB, to be handed out again
 * after a synchronization), thread B begins a global-mode capture (capture_race in
 * pool_workload.h: through the runtime or the driver) of the legacy stream (which cannot
 * capture: the begin fails) or of stream SA (it succeeds), and stops inside the real call.
 * Then a worker thread (global mode) asks cudaMalloc for 64 MiB: the pool synchronizes to take
 * back the 64 MiB freed, which no capture allows (the driver refuses a synchronization during
 * any capture and invalidates it), or grows. Run with VRAMSHIM_POOL_DEBUG=pause-request:
 * a request that waits for B's begin stops in the library where it found it must wait. The
 * main thread awaits the first of the worker's request returning and the library stopping it,
 * then lets B's begin go on; once B's begin returned it lets the library go on (if it
 * stopped); B ends its capture if it began.
 * Output: one line "capture_begin_fail: begin=RC worker=RC worker_first=0|1 syncs=N end=RC"
 * (worker_first: the worker's request returned while B's begin was stopped, before the
 * library stopped it to wait for the begin; syncs: the pool's synchronizations during the
 * worker's request). The worker must get 0; with "legacy" the pool must have synchronized
 * (syncs >= 1: no capture ever began; its request waits for the begin's outcome, or decides
 * without it); with "stream" not (syncs 0), and B's end must be 0 (the capture stayed valid).
 * Exit 1 when a value is not that, 2 on any other failure.
 */
#include <pthread.h>
#include <string.h>

#define PROG "capture_begin_fail"
#include "pool_workload.h"

static capture_race race;
static cudaError_t worker_rc = (cudaError_t)-1;
static long long syncs = -1;

static void *worker(void *arg) {
    (void)arg;
    void *big = NULL;
    stat_fn stat = pool_stat_or_exit();
    long long before = stat(0, "syncs");
    worker_rc = cudaMalloc(&big, 64 << 20);
    syncs = stat(0, "syncs") - before;
    capture_race_post(&race, EV_DONE);
    if (worker_rc == cudaSuccess) CHECK(cudaFree(big));
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 3 || (strcmp(argv[1], "runtime") != 0 && strcmp(argv[1], "driver") != 0) ||
        (strcmp(argv[2], "legacy") != 0 && strcmp(argv[2], "stream") != 0)) {
        fprintf(stderr, "usage: capture_begin_fail runtime|driver legacy|stream\n");
        return 2;
    }
    int legacy = strcmp(argv[2], "legacy") == 0;
    capture_race_open(&race, argv[1]);
    CHECK(cudaSetDevice(0));
    cudaStream_t sa;
    CHECK(cudaStreamCreateWithFlags(&sa, cudaStreamNonBlocking));
    void *w = NULL;
    CHECK(cudaMalloc(&w, 64 << 20));
    CHECK(cudaFree(w));

    capture_race_start(&race, legacy ? (cudaStream_t)0 : sa);
    if (race.pause_wait(10000) != CUDA_SUCCESS) {
        fprintf(stderr, PROG ": the begin never stopped (VRAMSIM_PAUSE_IN?)\n");
        return 2;
    }
    pthread_t wt;
    if (pthread_create(&wt, NULL, worker, NULL) != 0) return 2;
    int first = capture_race_next(&race);
    int worker_first = first == EV_DONE;
    race.pause_release();
    capture_race_expect(&race, EV_BEGUN, "B's begin");
    if (first == EV_PAUSED) capture_race_resume(&race);
    pthread_join(wt, NULL);
    capture_race_finish(&race);
    CHECK(cudaStreamDestroy(sa));
    printf(PROG ": begin=%d worker=%d worker_first=%d syncs=%lld end=%d\n", race.begin_rc,
           (int)worker_rc, worker_first, syncs, race.end_rc);
    if (legacy) {
        if (race.begin_rc == 0) return 2;
        return worker_rc == cudaSuccess && syncs >= 1 ? 0 : 1;
    }
    if (race.begin_rc != 0) return 2;
    return worker_rc == cudaSuccess && syncs == 0 && race.end_rc == 0 ? 0 : 1;
}
