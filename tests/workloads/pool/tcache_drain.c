/*
 * tcache_drain - blocks a thread freed with cudaFreeAsync (and which the pool may keep in
 * that thread's cache) must still serve another thread's request when memory is tight.
 *
 *   tcache_drain
 *
 * A helper thread allocates BLOCKS blocks of 8 MiB with cudaMallocAsync on its own stream,
 * frees them with cudaFreeAsync on that stream, synchronizes the stream and stays alive (its
 * cache stays claimed) until the main thread is done. The main thread then asks cudaMalloc
 * for BIG bytes: under VRAMSHIM_CAP=64MiB the pool cannot grow by that much beside the 48 MiB
 * it holds, so it must reuse the helper's freed pages.
 * Output: one line "tcache_drain: big=RC" (RC: cudaMalloc's code). Exit 0 if it succeeded,
 * 1 if it was refused, 2 on another CUDA error.
 */
#include <pthread.h>

#define PROG "tcache_drain"
#include "pool_workload.h"

#define BLOCKS 6
#define BLOCK (8u << 20)
#define BIG (40u << 20)

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int freed, done;

static void *helper(void *arg) {
    (void)arg;
    cudaStream_t s;
    void *p[BLOCKS];
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (int i = 0; i < BLOCKS; i++) CHECK(cudaMallocAsync(&p[i], BLOCK, s));
    for (int i = 0; i < BLOCKS; i++) CHECK(cudaFreeAsync(p[i], s));
    CHECK(cudaStreamSynchronize(s));
    pthread_mutex_lock(&mu);
    freed = 1;
    pthread_cond_broadcast(&cv);
    while (!done) pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
    return NULL;
}

int main(void) {
    CHECK(cudaFree(NULL));
    pthread_t t;
    pthread_create(&t, NULL, helper, NULL);
    pthread_mutex_lock(&mu);
    while (!freed) pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
    void *big = NULL;
    cudaError_t rc = cudaMalloc(&big, BIG);
    printf("tcache_drain: big=%d\n", (int)rc);
    if (rc == cudaSuccess) CHECK(cudaFree(big));
    pthread_mutex_lock(&mu);
    done = 1;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    pthread_join(t, NULL);
    if (rc == cudaSuccess) return 0;
    return rc == cudaErrorMemoryAllocation ? 1 : 2;
}
