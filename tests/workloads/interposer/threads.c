/* threads: 16 threads allocating and freeing concurrently (cudaMalloc/cudaFree and
 * cudaMallocAsync/cudaFreeAsync mixed) for ITERS rounds each; at a barrier in the middle
 * every thread holds exactly HOLD allocations and the main thread checks the live table
 * exactly; at the end everything is freed and the counts are exact.
 * Usage: threads [ITERS] */
#include <pthread.h>
#include <string.h>
#include "check.h"
#include "vs.h"

#define T 16
#define HOLD 8

static int iters = 20000;
static pthread_barrier_t bar;
static unsigned long long held_bytes[T];

static size_t size_of(int t, int i) { return 256u * (size_t)(1 + ((t * 7919 + i * 104729) % 64)); }

static void *worker(void *arg) {
    int t = (int)(long)arg;
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    void *live[HOLD] = {0};
    for (int i = 0; i < iters; i++) {
        int k = i % HOLD;
        if (live[k]) {
            if (k & 1)
                CK(cudaFreeAsync(live[k], s));
            else
                CK(cudaFree(live[k]));
        }
        if (k & 1)
            CK(cudaMallocAsync(&live[k], size_of(t, i), s));
        else
            CK(cudaMalloc(&live[k], size_of(t, i)));
    }
    /* every slot is live now: the last HOLD sizes */
    unsigned long long b = 0;
    for (int i = iters - HOLD; i < iters; i++) b += size_of(t, i);
    held_bytes[t] = b;
    pthread_barrier_wait(&bar); /* main checks */
    pthread_barrier_wait(&bar);
    for (int k = 0; k < HOLD; k++) CK(cudaFree(live[k]));
    CK(cudaStreamSynchronize(s));
    CK(cudaStreamDestroy(s));
    return NULL;
}

int main(int argc, char **argv) {
    vs_init();
    if (argc > 1) iters = atoi(argv[1]);
    EXPECT(iters >= HOLD);
    CK(cudaFree(NULL));
    pthread_barrier_init(&bar, NULL, T + 1);
    pthread_t th[T];
    for (long t = 0; t < T; t++) pthread_create(&th[t], NULL, worker, (void *)t);
    pthread_barrier_wait(&bar);
    unsigned long long sum = 0;
    for (int t = 0; t < T; t++) sum += held_bytes[t];
    EXPECT_VS("live_count.0", T * HOLD);
    EXPECT_VS("live_entries", T * HOLD);
    EXPECT_VS("live_bytes.0", sum);
    pthread_barrier_wait(&bar);
    for (int t = 0; t < T; t++) pthread_join(th[t], NULL);
    long long n = (long long)T * iters;
    long long async_n = 0;
    for (int i = 0; i < iters; i++) async_n += (i % HOLD) & 1;
    EXPECT_VS("calls.cudaMallocAsync", T * async_n);
    EXPECT_VS("calls.cudaMalloc", n - T * async_n);
    EXPECT_VS("calls.cudaFree", n - T * async_n + (long long)T * HOLD / 2 + 1);
    EXPECT_VS("calls.cudaFreeAsync", T * (async_n - HOLD / 2));
    EXPECT_VS("live_count.0", 0);
    EXPECT_VS("live_bytes.0", 0);
    EXPECT_VS("live_entries", 0);
    EXPECT_VS("unknown_frees", 0);
    EXPECT_VS("alloc_failures", 0);
    printf("threads: ok threads=%d iters=%d\n", T, iters);
    return 0;
}
