/* rt_multi: two devices (run with VRAMSIM_DEVICES=2): the current device is per thread,
 * allocations land on it, peer access. Prints "rt_multi: ok". */
#include <pthread.h>
#include "check.h"

static void *thread_main(void *arg) {
    int dev = -1;
    (void)arg;
    CK(cudaGetDevice(&dev));
    EXPECT_EQ(dev, 0); /* a new thread starts on device 0 */
    return NULL;
}

int main(void) {
    int n = 0, can = -1, dev = -1;
    CK(cudaGetDeviceCount(&n));
    EXPECT_EQ(n, 2);
    size_t f0a, f1a, f0b, f1b, t;
    CK(cudaSetDevice(1));
    CK(cudaGetDevice(&dev));
    EXPECT_EQ(dev, 1);
    CK(cudaMemGetInfo(&f1a, &t));
    CK(cudaSetDevice(0));
    CK(cudaMemGetInfo(&f0a, &t));
    CK(cudaSetDevice(1));
    void *p = NULL;
    CK(cudaMalloc(&p, 32 << 20));
    struct cudaPointerAttributes a;
    CK(cudaPointerGetAttributes(&a, p));
    EXPECT_EQ(a.device, 1);
    CK(cudaMemGetInfo(&f1b, &t));
    CK(cudaSetDevice(0));
    CK(cudaMemGetInfo(&f0b, &t));
    EXPECT(f1b + (32 << 20) <= f1a);
    EXPECT_EQ(f0b, f0a);
    pthread_t th;
    CK(cudaSetDevice(1));
    pthread_create(&th, NULL, thread_main, NULL);
    pthread_join(th, NULL);
    CK(cudaDeviceCanAccessPeer(&can, 1, 0));
    if (can) {
        CK(cudaDeviceEnablePeerAccess(0, 0));
    }
    EXPECT_EQ(cudaDeviceCanAccessPeer(&can, 0, 7), cudaErrorInvalidDevice);
    (void)cudaGetLastError();
    CK(cudaFree(p));
    printf("rt_multi: ok peer=%d\n", can);
    return 0;
}
