/* cross_free: pointers freed by other threads than the ones that allocated them, while
 * every thread keeps allocating and freeing its own (the interposer keeps a live-table part
 * per thread; a free of another thread's pointer has to find and claim it there, racing the
 * owner's own changes). Each round: every thread allocates K pointers and publishes them;
 * then frees the pointers of the next thread, with own alloc/free churn in between; then
 * frees the pointers of the thread after that once more (a double free of pointers another
 * thread just freed: every one must fail with the same code as without the preload, and be
 * counted as an unknown free); at the end every count is exact.
 * Usage: cross_free [ROUNDS] */
#include <pthread.h>
#include <string.h>
#include "check.h"
#include "vs.h"

#define T 8
#define K 64

static int rounds = 40;
static pthread_barrier_t bar;
static void *ptrs[T][K];
static long double_free_fails[T];
static int double_free_code[T];

static size_t size_of(int t, int i) { return 256u * (size_t)(1 + ((t * 31 + i * 17) % 16)); }

static void *worker(void *arg) {
    int t = (int)(long)arg;
    for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < K; i++) CK(cudaMalloc(&ptrs[t][i], size_of(t, i)));
        pthread_barrier_wait(&bar);
        int o = (t + 1) % T;
        for (int i = 0; i < K; i++) {
            CK(cudaFree(ptrs[o][i])); /* someone else's pointer */
            void *mine;
            CK(cudaMalloc(&mine, 512)); /* the owner's part changes meanwhile */
            CK(cudaFree(mine));
        }
        pthread_barrier_wait(&bar);
        int o2 = (t + 2) % T; /* freed by thread t+1 just now */
        for (int i = 0; i < K; i++) {
            int rc = cudaFree(ptrs[o2][i]);
            if (rc != 0) {
                double_free_fails[t]++;
                double_free_code[t] = rc;
            }
        }
        pthread_barrier_wait(&bar);
    }
    return NULL;
}

int main(int argc, char **argv) {
    vs_init();
    if (argc > 1) rounds = atoi(argv[1]);
    CK(cudaFree(NULL));
    pthread_barrier_init(&bar, NULL, T);
    pthread_t th[T];
    for (long t = 0; t < T; t++) pthread_create(&th[t], NULL, worker, (void *)t);
    for (int t = 0; t < T; t++) pthread_join(th[t], NULL);
    long fails = 0;
    for (int t = 0; t < T; t++) {
        fails += double_free_fails[t];
        EXPECT(double_free_code[t] == double_free_code[0]);
    }
    long long n = (long long)T * rounds * K;
    EXPECT(fails == n); /* every second free of a pointer fails */
    EXPECT_VS("calls.cudaMalloc", 2 * n);
    EXPECT_VS("calls.cudaFree", 3 * n + 1);
    EXPECT_VS("unknown_frees", n);
    EXPECT_VS("live_count.0", 0);
    EXPECT_VS("live_bytes.0", 0);
    EXPECT_VS("live_entries", 0);
    EXPECT_VS("alloc_failures", 0);
    printf("cross_free: ok threads=%d rounds=%d double-free code=%d\n", T, rounds,
           double_free_code[0]);
    return 0;
}
