/* bench_malloc: cudaMalloc+cudaFree pairs, for the interception benchmark (scripts/bench).
 * Usage: bench_malloc THREADS PAIRS_PER_THREAD SIZE
 * Prints: bench_malloc: threads=T pairs=N wall_ns_per_pair=W cpu_ns_per_pair=C
 *   wall_ns_per_pair = wall time / pairs per thread (the latency one thread sees)
 *   cpu_ns_per_pair  = process CPU time / all pairs (cost per pair, independent of how many
 *                      cores the threads share).
 *   thread_cpu_ns_per_pair = the calling threads' own CPU time / all pairs (leaves out helper
 *                      threads of the library, e.g. a trace writer). */
#include <pthread.h>
#include <string.h>
#include <time.h>
#include "check.h"

static long pairs;
static size_t size;
/* ready: every worker has warmed up; go: the main thread has read its start clocks. The
 * start is read between the two, so neither a warm-up nor a worker that runs before the main
 * thread is scheduled again (short runs on a busy machine) falls outside the interval. */
static pthread_barrier_t ready, go;
static double thread_cpu_total;
static pthread_mutex_t total_lock = PTHREAD_MUTEX_INITIALIZER;

static double now(clockid_t c) {
    struct timespec ts;
    clock_gettime(c, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static void *worker(void *arg) {
    (void)arg;
    void *p, *anchor;
    /* A small live allocation keeps the simulated driver's sub-page block mapped, so the
     * pairs below are served by its sub-page packing instead of an mmap/munmap each (which
     * costs ~16 us and would hide the interposer's few ns in noise). */
    CK(cudaMalloc(&anchor, 256));
    for (int i = 0; i < 1000; i++) { /* warm-up: thread-local state, caches */
        CK(cudaMalloc(&p, size));
        CK(cudaFree(p));
    }
    pthread_barrier_wait(&ready);
    pthread_barrier_wait(&go);
    double t0 = now(CLOCK_THREAD_CPUTIME_ID);
    for (long i = 0; i < pairs; i++) {
        CK(cudaMalloc(&p, size));
        CK(cudaFree(p));
    }
    double t1 = now(CLOCK_THREAD_CPUTIME_ID);
    pthread_mutex_lock(&total_lock);
    thread_cpu_total += t1 - t0;
    pthread_mutex_unlock(&total_lock);
    CK(cudaFree(anchor));
    return NULL;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    pairs = argc > 2 ? atol(argv[2]) : 200000;
    size = argc > 3 ? (size_t)atol(argv[3]) : 4096;
    CK(cudaFree(NULL));
    pthread_barrier_init(&ready, NULL, threads + 1);
    pthread_barrier_init(&go, NULL, threads + 1);
    pthread_t th[256];
    for (int t = 0; t < threads; t++) pthread_create(&th[t], NULL, worker, NULL);
    pthread_barrier_wait(&ready);
    double w0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_PROCESS_CPUTIME_ID);
    pthread_barrier_wait(&go);
    for (int t = 0; t < threads; t++) pthread_join(th[t], NULL);
    double w1 = now(CLOCK_MONOTONIC), c1 = now(CLOCK_PROCESS_CPUTIME_ID);
    printf("bench_malloc: threads=%d pairs=%ld wall_ns_per_pair=%.1f cpu_ns_per_pair=%.1f "
           "thread_cpu_ns_per_pair=%.1f\n",
           threads, pairs, (w1 - w0) / pairs, (c1 - c0) / ((double)pairs * threads),
           thread_cpu_total / ((double)pairs * threads));
    return 0;
}
