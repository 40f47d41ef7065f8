/*
 * busy_maps - a serving loop that never synchronizes the device: blocks of changing shapes
 * (2-40 MiB) allocated with cudaMallocAsync on one stream, the oldest of WINDOW live blocks
 * freed with cudaFreeAsync before each allocation, and every WAIT allocations a wait for the
 * stream alone (cudaStreamSynchronize), nothing else.
 *
 *   busy_maps STEPS WINDOW WAIT [SHRINK_AT SHRUNK]
 *
 * With SHRINK_AT and SHRUNK, from allocation SHRINK_AT on the oldest of SHRUNK live blocks
 * (fewer than WINDOW) is freed before each allocation instead: the live bytes shrink, and a
 * tight pool's budget follows them once its windows roll.
 *
 * Between two waits the stream is held behind a host function that the program lets go just
 * before it waits: the stream passes the frees of an interval at the wait and not before
 * (the pool's events recorded meanwhile are complete from the wait on, whatever the
 * threads' timing), as in the pool's model (`AccountingDevice::stream_sync`). Sizes come
 * from the xorshift stream of the workload's model, `vramshim_testkit::busy_maps` (seed
 * 0x9e3779b97f4a7c15).
 * Prints "busy_maps most=M most_pages=Q mappings=N pages=P syncs=S": the most mappings and
 * the most pages the pool held after any allocation, its mappings and pages at the end
 * (before freeing the window), and its own synchronizations; or "busy_maps: no library".
 * Exit 0, or 2 on a CUDA error.
 */
#include <pthread.h>
#include <stdint.h>

#define PROG "busy_maps"
#include "pool_workload.h"

static pthread_mutex_t gate_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cv = PTHREAD_COND_INITIALIZER;
static long gate_open; /* intervals let go so far */

/* Runs on the stream: holds it until the program lets interval `arg` go. */
static void gate(void *arg) {
    long n = (long)(intptr_t)arg;
    pthread_mutex_lock(&gate_lock);
    while (gate_open < n) pthread_cond_wait(&gate_cv, &gate_lock);
    pthread_mutex_unlock(&gate_lock);
}

static void let_go(long n) {
    pthread_mutex_lock(&gate_lock);
    gate_open = n;
    pthread_cond_broadcast(&gate_cv);
    pthread_mutex_unlock(&gate_lock);
}

static uint64_t seed = 0x9e3779b97f4a7c15ull;
static uint64_t next(uint64_t n) {
    seed ^= seed << 13;
    seed ^= seed >> 7;
    seed ^= seed << 17;
    return seed % n;
}

int main(int argc, char **argv) {
    stat_fn g = pool_stat_or_exit();
    if (argc != 4 && argc != 6) {
        fprintf(stderr, "usage: busy_maps STEPS WINDOW WAIT [SHRINK_AT SHRUNK]\n");
        return 2;
    }
    long steps = atol(argv[1]), window = atol(argv[2]), wait = atol(argv[3]);
    long shrink_at = argc == 6 ? atol(argv[4]) : steps, shrunk = argc == 6 ? atol(argv[5]) : window;
    if (steps < 1 || window < 1 || window > 1024 || wait < 1 || shrunk < 1 || shrunk > window) {
        fprintf(stderr, "busy_maps: bad arguments\n");
        return 2;
    }
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    void *live[1024];
    long head = 0, n = 0, interval = 1;
    long long most = 0, most_pages = 0;
    const uint64_t mib = 1u << 20;
    CHECK(cudaLaunchHostFunc(s, gate, (void *)(intptr_t)interval));
    for (long step = 0; step < steps; step++) {
        long w = step < shrink_at ? window : shrunk;
        while (n >= w) {
            CHECK(cudaFreeAsync(live[head], s));
            head = (head + 1) % window;
            n--;
        }
        size_t size = (size_t)(2 * mib + next(38 * mib));
        CHECK(cudaMallocAsync(&live[(head + n) % window], size, s));
        n++;
        long long m = g(0, "mappings");
        if (m > most) most = m;
        long long pg = g(0, "reserved") / (long long)(2 * mib);
        if (pg > most_pages) most_pages = pg;
        if ((step + 1) % wait == 0) {
            let_go(interval);
            CHECK(cudaStreamSynchronize(s));
            interval++;
            CHECK(cudaLaunchHostFunc(s, gate, (void *)(intptr_t)interval));
        }
    }
    printf("busy_maps most=%lld most_pages=%lld mappings=%lld pages=%lld syncs=%lld\n", most,
           most_pages, g(0, "mappings"), g(0, "reserved") / (long long)(2 * mib), g(0, "syncs"));
    fflush(stdout);
    let_go(interval);
    while (n > 0) {
        CHECK(cudaFreeAsync(live[head], s));
        head = (head + 1) % window;
        n--;
    }
    CHECK(cudaStreamSynchronize(s));
    return 0;
}
