/*
 * pool_workload.h - what the pool's C workloads share. Define PROG (the program's name, which
 * starts every line it prints) before including it.
 *
 *   CHECK(call)          a runtime call that must succeed: otherwise one line on stderr
 *                        ("PROG: call failed: CODE (line N)") and exit 2
 *   pool_stat_or_exit()  the preloaded library's vramshim_pool_stat; without the library,
 *                        "PROG: no library" on stdout and exit 0
 *   rotating_pairs(n)    n cudaMalloc + cudaFree pairs of 1..8 MiB in rotation (cudaFree'd:
 *                        no thread cache keeps them, every free reaches the pool)
 *   foreign_bytes(b, n, s, host)
 *                        fills block b (n bytes) with 0x55 on stream s (no delay), synchronizes
 *                        s and the device, reads b back into host (n bytes at least) and returns
 *                        how many bytes are not 0x55: those a late write into a block freed
 *                        earlier put there (the pool handed its bytes out too early)
 *
 * Capture races (capture_window, capture_settle_locked, capture_begin_fail): thread B begins a
 * global-mode capture of one stream while another thread's call is stopped, and the main thread
 * orders the threads by handshake, never by sleeping. Events are bytes in one pipe, read in the
 * order they came: EV_BEGUN (B's begin returned), EV_DONE (posted by the workload when its
 * worker's request returned) and EV_PAUSED (the library stopped at its pause point,
 * VRAMSHIM_POOL_DEBUG=pause-begin, pause-request or pause-settled: it writes the byte itself,
 * to the pipe's end the workload places at the descriptors VRAMSHIM_POOL_PAUSE_FDS=NOTIFY,RESUME
 * name).
 *
 *   capture_race_open(r, entry)
 *                        cuda-sim's pause point (vramsimPauseWait/Release: VRAMSIM_PAUSE_IN
 *                        stops a call on entry until released), B's entry points ("runtime":
 *                        cudaStreamBeginCapture/EndCapture; "driver": cuStreamBeginCapture_v2
 *                        and cuStreamEndCapture from dlsym) and the pipes; exit 2 on failure
 *   capture_race_start(r, s)
 *                        starts B: it begins capturing s in global mode, posts EV_BEGUN, and
 *                        once capture_race_finish lets it, ends the capture if it began
 *   capture_race_post(r, ev)
 *                        posts an event (any thread)
 *   capture_race_next(r) the next event; exit 2 after 10 s without one (a failure, not an
 *                        order: every wait of a passing run ends on an event)
 *   capture_race_expect(r, ev, what)
 *                        the next event must be ev, else exit 2 saying what was awaited
 *   capture_race_resume(r)
 *                        lets the library go on from its pause point
 *   capture_race_finish(r)
 *                        lets B end its capture and joins it: r->begin_rc, r->end_rc
 *   capture_race_during(r, s, worker)
 *                        the whole race of a begin during a worker's call: starts the worker
 *                        thread, awaits its call stopping in cuda-sim, starts B on s, awaits
 *                        the first of B's begin returning and the library stopping B
 *                        (pause-begin), lets the worker's call go on; if the library stopped B,
 *                        awaits the worker's EV_DONE and lets the library go on; joins the
 *                        worker, then capture_race_finish. Returns begun_first: B's begin
 *                        returned first
 *   capture_race_after_pause(r, s, worker)
 *                        the race of a begin while the worker's request is stopped in the
 *                        library (pause-settled, with pause-begin): starts the worker thread,
 *                        awaits the library stopping it, starts B on s, awaits the first of B's
 *                        begin returning and the library stopping B, then lets every thread
 *                        the library stopped go on (one byte each); joins the worker, then
 *                        capture_race_finish. Returns begun_first
 *   capture_race_after_return(r, s, worker)
 *                        a begin after the worker's request returned: runs the worker thread
 *                        to its EV_DONE and joins it, then starts B on s and awaits the first
 *                        of B's begin returning and the library stopping B (pause-begin: a
 *                        section the request left open); if the library stopped B, lets it go
 *                        on and awaits its begin; then capture_race_finish. Returns whether
 *                        the library stopped B
 */
#ifndef VRAMSHIM_POOL_WORKLOAD_H
#define VRAMSHIM_POOL_WORKLOAD_H

#include <dlfcn.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_api.h"

#ifndef PROG
#error "define PROG, the program's name, before including pool_workload.h"
static inline int capture_race_after_return(capture_race *r, cudaStream_t s, void *(*worker)(void *)) {
    pthread_t w;
    if (pthread_create(&w, NULL, worker, NULL) != 0) exit(2);
    capture_race_expect(r, EV_DONE, "the worker's request");
    pthread_join(w, NULL);
    capture_race_start(r, s);
    int first = capture_race_next(r);
    if (first == EV_PAUSED) {
        capture_race_resume(r);
        capture_race_expect(r, EV_BEGUN, "B's begin");
    }
    capture_race_finish(r);
    return first == EV_PAUSED;
}

#endif

#define CHECK(x)                                                                           \
    do {                                                                                   \
        cudaError_t e_ = (x);                                                              \
        if (e_ != cudaSuccess) {                                                           \
            fprintf(stderr, PROG ": %s failed: %d (line %d)\n", #x, (int)e_, __LINE__);     \
            exit(2);                                                                       \
        }                                                                                  \
    } while (0)

/* vramshim_pool_stat(device, field): one of the pool's statistics, -1 for an unknown one. */
typedef long long (*stat_fn)(int, const char *);

static inline stat_fn pool_stat_or_exit(void) {
    stat_fn g = (stat_fn)dlsym(RTLD_DEFAULT, "vramshim_pool_stat");
    if (!g) {
        printf(PROG ": no library\n");
        exit(0);
    }
    return g;
}

static inline void rotating_pairs(int n) {
    void *p;
    for (int i = 0; i < n; i++) {
        CHECK(cudaMalloc(&p, (size_t)(1 + i % 8) << 20));
        CHECK(cudaFree(p));
    }
}

static inline long foreign_bytes(void *b, size_t n, cudaStream_t s, unsigned char *host) {
    CHECK(vramsimKernelFill(b, 0x55, n, 0, s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(host, b, n, cudaMemcpyDeviceToHost));
    long bad = 0;
    for (size_t k = 0; k < n; k++)
        bad += host[k] != 0x55;
    return bad;
}

enum { EV_BEGUN = 'B', EV_DONE = 'D', EV_PAUSED = 'P' };

typedef struct {
    CUresult (*pause_wait)(unsigned int);
    CUresult (*pause_release)(void);
    /* B's entry points through the driver; NULL: through the runtime */
    CUresult (*begin)(CUstream, int);
    CUresult (*end)(CUstream, void **);
    int ev_read, ev_write, resume_write;
    cudaStream_t stream;
    pthread_t b;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int may_end;
    int begin_rc, end_rc;
} capture_race;

/* fd moved to descriptor number want (none: want < 0); returns the descriptor to use */
static inline int capture_race_place(int fd, int want) {
    if (want < 0 || want == fd) return fd;
    if (dup2(fd, want) != want) {
        fprintf(stderr, PROG ": cannot place a pipe at descriptor %d\n", want);
        exit(2);
    }
    close(fd);
    return want;
}

static inline void capture_race_open(capture_race *r, const char *entry) {
    memset(r, 0, sizeof *r);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    r->begin_rc = r->end_rc = -1;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    r->pause_wait = lib ? (CUresult(*)(unsigned int))dlsym(lib, "vramsimPauseWait") : NULL;
    r->pause_release = lib ? (CUresult(*)(void))dlsym(lib, "vramsimPauseRelease") : NULL;
    if (!r->pause_wait || !r->pause_release) {
        fprintf(stderr, PROG ": no pause point (cuda-sim only)\n");
        exit(2);
    }
    if (strcmp(entry, "driver") == 0) {
        r->begin = (CUresult(*)(CUstream, int))dlsym(lib, "cuStreamBeginCapture_v2");
        r->end = (CUresult(*)(CUstream, void **))dlsym(lib, "cuStreamEndCapture");
        if (!r->begin || !r->end) {
            fprintf(stderr, PROG ": no capture entry points\n");
            exit(2);
        }
    }
    int ev[2], go[2], notify = -1, resume = -1;
    if (pipe(ev) != 0 || pipe(go) != 0) {
        fprintf(stderr, PROG ": no pipe\n");
        exit(2);
    }
    /* numbers above any the pipes got, so that placing one closes none of the others */
    const char *fds = getenv("VRAMSHIM_POOL_PAUSE_FDS");
    if (fds && (sscanf(fds, "%d,%d", &notify, &resume) != 2 || notify < 10 || resume < 10 ||
                notify == resume)) {
        fprintf(stderr, PROG ": VRAMSHIM_POOL_PAUSE_FDS=%s: two descriptors of 10 or more\n", fds);
        exit(2);
    }
    /* the library writes to NOTIFY (the events' write end) and reads from RESUME */
    r->ev_read = ev[0];
    r->ev_write = capture_race_place(ev[1], notify);
    capture_race_place(go[0], resume);
    r->resume_write = go[1];
}

static inline void capture_race_post(capture_race *r, char ev) {
    if (write(r->ev_write, &ev, 1) != 1) exit(2);
}

static inline int capture_race_next(capture_race *r) {
    struct pollfd p = {.fd = r->ev_read, .events = POLLIN};
    char ev;
    if (poll(&p, 1, 10000) != 1 || read(r->ev_read, &ev, 1) != 1) {
        fprintf(stderr, PROG ": no event in 10 s\n");
        exit(2);
    }
    return ev;
}

static inline void capture_race_expect(capture_race *r, int ev, const char *what) {
    int got = capture_race_next(r);
    if (got != ev) {
        fprintf(stderr, PROG ": awaiting %s, got event %c\n", what, got);
        exit(2);
    }
}

static inline void capture_race_resume(capture_race *r) {
    char go = 'G';
    if (write(r->resume_write, &go, 1) != 1) exit(2);
}

static inline void *capture_race_b(void *arg) {
    capture_race *r = arg;
    int rc = r->begin ? (int)r->begin((CUstream)r->stream, cudaStreamCaptureModeGlobal)
                      : (int)cudaStreamBeginCapture(r->stream, cudaStreamCaptureModeGlobal);
    r->begin_rc = rc;
    capture_race_post(r, EV_BEGUN);
    pthread_mutex_lock(&r->mu);
    while (!r->may_end) pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
    if (rc == 0) {
        cudaGraph_t g = NULL;
        r->end_rc = r->end ? (int)r->end((CUstream)r->stream, (void **)&g)
                           : (int)cudaStreamEndCapture(r->stream, &g);
        if (r->end_rc == 0 && g) CHECK(cudaGraphDestroy(g));
    }
    return NULL;
}

static inline void capture_race_start(capture_race *r, cudaStream_t s) {
    r->stream = s;
    if (pthread_create(&r->b, NULL, capture_race_b, r) != 0) exit(2);
}

/* after it B's results may be read: the join orders them */
static inline void capture_race_finish(capture_race *r) {
    pthread_mutex_lock(&r->mu);
    r->may_end = 1;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    pthread_join(r->b, NULL);
}

static inline int capture_race_during(capture_race *r, cudaStream_t s, void *(*worker)(void *)) {
    pthread_t w;
    if (pthread_create(&w, NULL, worker, NULL) != 0) exit(2);
    if (r->pause_wait(10000) != CUDA_SUCCESS) {
        fprintf(stderr, PROG ": the worker's call never stopped (VRAMSIM_PAUSE_IN?)\n");
        exit(2);
    }
    capture_race_start(r, s);
    int first = capture_race_next(r);
    r->pause_release();
    if (first == EV_PAUSED) {
        capture_race_expect(r, EV_DONE, "the worker's request");
        capture_race_resume(r);
    }
    pthread_join(w, NULL);
    capture_race_finish(r);
    return first == EV_BEGUN;
}

static inline int capture_race_after_pause(capture_race *r, cudaStream_t s, void *(*worker)(void *)) {
    pthread_t w;
    if (pthread_create(&w, NULL, worker, NULL) != 0) exit(2);
    capture_race_expect(r, EV_PAUSED, "the worker's request stopping in the library");
    capture_race_start(r, s);
    int first = capture_race_next(r);
    /* the worker; and B, when the library stopped it too (each reads one byte) */
    capture_race_resume(r);
    if (first == EV_PAUSED) capture_race_resume(r);
    pthread_join(w, NULL);
    capture_race_finish(r);
    return first == EV_BEGUN;
}

static inline int capture_race_after_return(capture_race *r, cudaStream_t s, void *(*worker)(void *)) {
    pthread_t w;
    if (pthread_create(&w, NULL, worker, NULL) != 0) exit(2);
    capture_race_expect(r, EV_DONE, "the worker's request");
    pthread_join(w, NULL);
    capture_race_start(r, s);
    int first = capture_race_next(r);
    if (first == EV_PAUSED) {
        capture_race_resume(r);
        capture_race_expect(r, EV_BEGUN, "B's begin");
    }
    capture_race_finish(r);
    return first == EV_PAUSED;
}

#endif
