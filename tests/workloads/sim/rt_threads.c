/* rt_threads: 16 threads make their first CUDA call at the same moment. Every call succeeds,
 * the runtime initializes once and the device's primary context is retained once (the
 * per-context overhead is charged once, not per thread). Prints "rt_threads: ok used=BYTES". */
#include <pthread.h>
#include "check.h"

#define THREADS 16
static pthread_barrier_t barrier;
static void *ptrs[THREADS];

static void *worker(void *arg) {
    long i = (long)arg;
    pthread_barrier_wait(&barrier);
    CK(cudaMalloc(&ptrs[i], 1 << 20));
    CK(cudaMemset(ptrs[i], (int)i, 1 << 20));
    return NULL;
}

int main(void) {
    pthread_t t[THREADS];
    pthread_barrier_init(&barrier, NULL, THREADS);
    for (long i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, worker, (void *)i);
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    size_t free_b, total;
    CK(cudaMemGetInfo(&free_b, &total));
    unsigned char b = 0;
    for (int i = 0; i < THREADS; i++) {
        CK(cudaMemcpy(&b, (char *)ptrs[i] + 4096, 1, cudaMemcpyDeviceToHost));
        EXPECT_EQ(b, i);
        CK(cudaFree(ptrs[i]));
    }
    printf("rt_threads: ok used=%zu\n", total - free_b);
    return 0;
}
