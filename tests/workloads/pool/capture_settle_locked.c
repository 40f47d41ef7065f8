/*
 * capture_settle_locked - the cap empties the driver's pools (cuCtxSynchronize) for a page the
 * pool needs, under the pool's lock, while another thread's begin-capture call waits for that
 * lock: the begin cannot begin its capture before the lock is let go, so the pool's request
 * must settle and get its memory, not wait for the begin and then count it as under way. Run
 * with VRAMSHIM_POOL=stitch, a 48 MiB cap (context excluded) and
 * VRAMSIM_PAUSE_IN=cuMemGetAllocationGranularity (the pool's first driver call, made under its
 * lock as it creates the device's pool).
 *
 *   capture_settle_locked runtime|driver
 *
 * The driver's default pool keeps every freed block (release threshold UINT64_MAX). A worker
 * thread allocates 40 MiB from it (cudaMallocFromPoolAsync on its stream, which the library's
 * pool does not serve) and frees it there: the cap still charges those 40 MiB, cached in the
 * driver's pool. Then the worker asks cudaMalloc for 16 MiB: the pool is created (its first
 * call stops in the driver, the pool's lock held) and grows; a page past the cap makes the cap
 * empty the driver's pools first. While the worker is stopped, thread B begins capturing stream
 * SA in global mode (capture_race in pool_workload.h: through the runtime or the driver); it
 * must wait for the pool's lock. Run with VRAMSHIM_POOL_DEBUG=pause-begin: the library stops B
 * where it found the lock held. The main thread awaits the first of B's begin returning (it
 * must not) and the library stopping B, then lets the worker go on; once the worker's request
 * returned it lets the library go on, and B ends its capture after the worker is done; then
 * the main thread frees the worker's 16 MiB.
 * Output: one line "capture_settle_locked: worker=RC begun_first=0|1 end=RC". Exit 0 when the
 * worker got its memory (0) and B's capture ended valid (0), 1 otherwise, 2 on any other
 * failure.
 */
#include <pthread.h>
#include <string.h>

#define PROG "capture_settle_locked"
#include "pool_workload.h"

static capture_race race;
static cudaStream_t ws;
static cudaMemPool_t mp;
static cudaError_t worker_rc = (cudaError_t)-1;
/* the worker's request, freed by the main thread once B's capture ended */
static void *big;

static void *worker(void *arg) {
    (void)arg;
    void *a = NULL;
    CHECK(cudaMallocFromPoolAsync(&a, 40 << 20, mp, ws));
    CHECK(cudaFreeAsync(a, ws));
    worker_rc = cudaMalloc(&big, 16 << 20);
    capture_race_post(&race, EV_DONE);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 2 || (strcmp(argv[1], "runtime") != 0 && strcmp(argv[1], "driver") != 0)) {
        fprintf(stderr, "usage: capture_settle_locked runtime|driver\n");
        return 2;
    }
    capture_race_open(&race, argv[1]);
    CHECK(cudaSetDevice(0));
    cudaStream_t sa;
    CHECK(cudaStreamCreateWithFlags(&sa, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&ws, cudaStreamNonBlocking));
    CHECK(cudaDeviceGetDefaultMemPool(&mp, 0));
    unsigned long long keep = ~0ull;
    CHECK(cudaMemPoolSetAttribute(mp, cudaMemPoolAttrReleaseThreshold, &keep));

    int begun_first = capture_race_during(&race, sa, worker);
    if (worker_rc == cudaSuccess) CHECK(cudaFree(big));
    CHECK(cudaStreamDestroy(sa));
    CHECK(cudaStreamDestroy(ws));
    printf(PROG ": worker=%d begun_first=%d end=%d\n", (int)worker_rc, begun_first, race.end_rc);
    if (race.begin_rc != 0) {
        fprintf(stderr, PROG ": begin failed: %d\n", race.begin_rc);
        return 2;
    }
    return worker_rc == cudaSuccess && race.end_rc == 0 ? 0 : 1;
}
