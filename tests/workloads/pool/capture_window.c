/*
 * capture_window - a capture another thread begins while the pool serves a request: the
 * request decided that no capture forbids its calls, and must not make one after the capture
 * began. Run with VRAMSIM_PAUSE_IN=cuMemCreate (cuda-sim stops the first cuMemCreate on entry
 * until released).
 *
 *   capture_window runtime|driver [oom|settle|settled|short|failed|sync]
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
 * there (cudaMallocAsync, begun before the capture), which the cap would refuse while the
 * driver's pool caches the first 40: the cap
 * empties the driver's pools, after it decided no capture forbids the synchronization that
 * takes; that cuCtxSynchronize stops in the driver, and B begins its capture then. The worker
 * must get 0.
 * With "settled" (the same worker and cap as "settle", run with VRAMSHIM_POOL_DEBUG=
 * pause-settled,pause-begin and no VRAMSIM_PAUSE_IN) the library stops the worker's request
 * once the cap emptied the driver's pools, before the request's own cudaMallocAsync; B begins
 * its capture then (capture_race_after_pause). The request began before the capture: its
 * allocation must precede it, and the worker must get 0 with B's end 0. Made inside B's
 * global capture, the allocation on the worker's stream (which does not capture) is refused
 * (900) and invalidates the capture (901).
 * With "short" or "failed" (the cap of "settle", run with VRAMSHIM_POOL_DEBUG=pause-begin) the
 * cap's settle keeps its section open for the request's own allocation, and the request ends
 * without making it or with it failed: B begins its capture only after the worker's request
 * returned (capture_race_after_return), and the library must not stop it (no section left
 * open). "short": the worker keeps 16 MiB, frees 24 MiB stream-ordered (the driver's pool
 * caches it) and asks for 40 MiB more: the settle gives back the 24 but 56 MiB do not fit
 * the cap, the request is refused (2). "failed": the worker of "settle", run with the
 * driver's second cuMemAllocAsync failing (VRAMSIM_FAIL=cuMemAllocAsync:nth=2): the settle
 * makes room, the real allocation fails (2).
 * A worker thread (global mode) asks cudaMalloc for 64 MiB: the pool grows, and its first
 * cuMemCreate stops in the driver, the pool's lock held. Then thread B begins capturing stream
 * SA in global mode (capture_race in pool_workload.h: through the runtime or the driver). Run
 * with VRAMSHIM_POOL_DEBUG=pause-begin: a begin that waits for the worker's call stops in the
 * library where it found it must wait. The main thread awaits the first of B's begin returning
 * and the library stopping B, then lets the worker's call go on; once the worker's request
 * returned it lets the library go on (if it stopped), and B ends its capture; then the main
 * thread frees the worker's allocation.
 * Output: one line "capture_window: worker=RC begun_first=0|1 waited=0|1 end=RC" (worker: the
 * 64 MiB request's result; begun_first: B's begin returned while the worker's call was
 * stopped, before the library stopped it to wait; waited ("short", "failed"): the library
 * stopped B's begin, made after the request returned, to wait for a section; end: B's end-capture result, 0 when the capture
 * stayed valid, 901 when the pool's call invalidated it). Exit 1 if the capture ended
 * invalid, else 2 on any other failure.
 */
#include <pthread.h>
#include <string.h>

#define PROG "capture_window"
#include "pool_workload.h"

static capture_race race;
static cudaError_t worker_rc = (cudaError_t)-1;
static int settle, settled, after, short_, sync_first;
static cudaStream_t ws;
/* the worker's request, freed by the main thread once B's capture ended (a free while it is
 * under way is no part of the race) */
static void *big;
/* "short": the worker's 16 MiB, kept over its request */
static void *kept;

static void *worker(void *arg) {
    (void)arg;
    if (short_) {
        void *a = NULL;
        CHECK(cudaMalloc(&kept, 16 << 20));
        CHECK(cudaMallocAsync(&a, 24 << 20, ws));
        CHECK(cudaFreeAsync(a, ws));
        worker_rc = cudaMallocAsync(&big, 40 << 20, ws);
    } else if (settle) {
        void *a = NULL;
        CHECK(cudaMallocAsync(&a, 40 << 20, ws));
        CHECK(cudaFreeAsync(a, ws));
        /* stream-ordered on a stream that does not capture: made before B's begin, else a
         * global capture would forbid it (driver_facts.expected, alloc_async_other_stream) */
        worker_rc = cudaMallocAsync(&big, 40 << 20, ws);
    } else {
        if (sync_first) {
            CHECK(cudaMalloc(&big, 64 << 20));
            CHECK(cudaFree(big));
        }
        worker_rc = cudaMalloc(&big, 64 << 20);
    }
    capture_race_post(&race, EV_DONE);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2 || argc > 3 || (strcmp(argv[1], "runtime") != 0 && strcmp(argv[1], "driver") != 0) ||
        (argc == 3 && strcmp(argv[2], "oom") != 0 && strcmp(argv[2], "settle") != 0 &&
         strcmp(argv[2], "settled") != 0 && strcmp(argv[2], "short") != 0 &&
         strcmp(argv[2], "failed") != 0 && strcmp(argv[2], "sync") != 0)) {
        fprintf(stderr, "usage: capture_window runtime|driver [oom|settle|settled|short|failed|sync]\n");
        return 2;
    }
    int oom = argc == 3 && strcmp(argv[2], "oom") == 0;
    settled = argc == 3 && strcmp(argv[2], "settled") == 0;
    short_ = argc == 3 && strcmp(argv[2], "short") == 0;
    after = short_ || (argc == 3 && strcmp(argv[2], "failed") == 0);
    settle = settled || after || (argc == 3 && strcmp(argv[2], "settle") == 0);
    sync_first = argc == 3 && strcmp(argv[2], "sync") == 0;
    capture_race_open(&race, argv[1]);
    CHECK(cudaSetDevice(0));
    cudaStream_t sa;
    CHECK(cudaStreamCreateWithFlags(&sa, cudaStreamNonBlocking));
    if (settle) {
        CHECK(cudaStreamCreateWithFlags(&ws, cudaStreamNonBlocking));
        cudaMemPool_t mp;
        CHECK(cudaDeviceGetDefaultMemPool(&mp, 0));
        unsigned long long keep = ~0ull;
        CHECK(cudaMemPoolSetAttribute(mp, cudaMemPoolAttrReleaseThreshold, &keep));
    }

    int begun_first = 0, waited = 0;
    if (after)
        waited = capture_race_after_return(&race, sa, worker);
    else
        begun_first = settled ? capture_race_after_pause(&race, sa, worker)
                              : capture_race_during(&race, sa, worker);
    if (worker_rc == cudaSuccess) CHECK(settle ? cudaFreeAsync(big, ws) : cudaFree(big));
    if (kept) CHECK(cudaFree(kept));
    CHECK(cudaStreamDestroy(sa));
    printf(PROG ": worker=%d begun_first=%d waited=%d end=%d\n", (int)worker_rc, begun_first,
           waited, race.end_rc);
    if (race.begin_rc != 0) {
        fprintf(stderr, PROG ": begin failed: %d\n", race.begin_rc);
        return 2;
    }
    if (race.end_rc != 0) return 1;
    return worker_rc == (oom || after ? cudaErrorMemoryAllocation : cudaSuccess) ? 0 : 2;
}
