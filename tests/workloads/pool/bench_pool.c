/* bench_pool: allocate+free pairs for the pool benchmark (scripts/bench pool).
 * Usage: bench_pool sync|async THREADS PAIRS_PER_THREAD SIZE
 *   sync:  cudaMalloc + cudaFree
 *   async: cudaMallocAsync + cudaFreeAsync on the thread's own non-blocking stream
 * Prints: bench_pool: mode=M threads=T pairs=N wall_ns_per_pair=W cpu_ns_per_pair=C
 *   cpu_ns_per_pair = process CPU time / all pairs. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_api.h"

#define CK(x)                                                                              \
    do {                                                                                   \
        cudaError_t e_ = (x);                                                              \
        if (e_ != cudaSuccess) {                                                           \
            fprintf(stderr, "bench_pool: %s -> %d (line %d)\n", #x, (int)e_, __LINE__);    \
            exit(2);                                                                       \
        }                                                                                  \
    } while (0)

static long pairs;
static size_t size;
static int async_mode;
/* ready: every worker has warmed up; go: the main thread has read its start clocks. The
 * start is read between the two, so neither a warm-up nor a worker that runs before the main
 * thread is scheduled again (short runs on a busy machine) falls outside the interval. */
static pthread_barrier_t ready, go;

static double now(clockid_t c) {
    struct timespec ts;
    clock_gettime(c, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static void pair(cudaStream_t s) {
    void *p;
    if (async_mode) {
        CK(cudaMallocAsync(&p, size, s));
        CK(cudaFreeAsync(p, s));
    } else {
        CK(cudaMalloc(&p, size));
        CK(cudaFree(p));
    }
}

static void *worker(void *arg) {
    (void)arg;
    cudaStream_t s = NULL;
    void *anchor;
    if (async_mode) CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaMalloc(&anchor, 256)); /* keeps the simulated driver's sub-page block mapped */
    for (int i = 0; i < 1000; i++) pair(s); /* warm-up */
    pthread_barrier_wait(&ready);
    pthread_barrier_wait(&go);
    for (long i = 0; i < pairs; i++) pair(s);
    CK(cudaFree(anchor));
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: bench_pool sync|async THREADS PAIRS SIZE\n");
        return 2;
    }
    async_mode = strcmp(argv[1], "async") == 0;
    int threads = atoi(argv[2]);
    pairs = atol(argv[3]);
    size = (size_t)atol(argv[4]);
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
    printf("bench_pool: mode=%s threads=%d pairs=%ld wall_ns_per_pair=%.1f cpu_ns_per_pair=%.1f\n", argv[1],
           threads, pairs, (w1 - w0) / pairs, (c1 - c0) / ((double)pairs * threads));
    return 0;
}
