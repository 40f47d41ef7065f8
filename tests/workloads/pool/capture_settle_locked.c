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
 * SA in global mode (runtime: cudaStreamBeginCapture; driver: cuStreamBeginCapture_v2 from
 * dlsym); it must wait for the pool's lock. The main thread waits up to 300 ms for B's begin to
 * return (it must not), then lets the worker go on; B ends its capture after the worker is done.
 * Output: one line "capture_settle_locked: worker=RC begun_first=0|1 end=RC". Exit 0 when the
 * worker got its memory (0) and B's capture ended valid (0), 1 otherwise, 2 on any other
 * failure.
 */
#include <pthread.h>
#include <string.h>
#include <time.h>

#define PROG "capture_settle_locked"
#include "pool_workload.h"

typedef CUresult (*begin_fn)(CUstream, int);
typedef CUresult (*end_fn)(CUstream, void **);
typedef CUresult (*pause_wait_fn)(unsigned int);
typedef CUresult (*pause_release_fn)(void);

static cudaStream_t sa, ws;
static cudaMemPool_t mp;
static begin_fn begin;
static end_fn end;
static cudaError_t worker_rc = (cudaError_t)-1;
static int begin_rc = -1, end_rc = -1;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int begun, may_end;

static void *worker(void *arg) {
    (void)arg;
    void *a = NULL, *big = NULL;
    CHECK(cudaMallocFromPoolAsync(&a, 40 << 20, mp, ws));
    CHECK(cudaFreeAsync(a, ws));
    worker_rc = cudaMalloc(&big, 16 << 20);
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
    if (argc != 2 || (strcmp(argv[1], "runtime") != 0 && strcmp(argv[1], "driver") != 0)) {
        fprintf(stderr, "usage: capture_settle_locked runtime|driver\n");
        return 2;
    }
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
    CHECK(cudaStreamCreateWithFlags(&ws, cudaStreamNonBlocking));
    CHECK(cudaDeviceGetDefaultMemPool(&mp, 0));
    unsigned long long keep = ~0ull;
    CHECK(cudaMemPoolSetAttribute(mp, cudaMemPoolAttrReleaseThreshold, &keep));

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
    CHECK(cudaStreamDestroy(ws));
    printf(PROG ": worker=%d begun_first=%d end=%d\n", (int)worker_rc, begun_first, end_rc);
    if (begin_rc != 0) {
        fprintf(stderr, PROG ": begin failed: %d\n", begin_rc);
        return 2;
    }
    return worker_rc == cudaSuccess && end_rc == 0 ? 0 : 1;
}
