/* device_switch: allocations follow the current device as the program switches it (the
 * interposer remembers each thread's runtime device and must forget it whenever it may
 * change). Needs VRAMSIM_DEVICES=2. Switches with cudaSetDevice (through the PLT and through
 * dlsym), on several threads at once, and after driver context changes; after every step
 * the bytes live per device are checked.
 * Usage: device_switch */
#include <dlfcn.h>
#include <pthread.h>
#include <string.h>
#include "check.h"
#include "vs.h"

#define MiB (1u << 20)

static pthread_barrier_t bar;

static void *on_device(void *arg) {
    int dev = (int)(long)arg;
    if (dev >= 0) CK(cudaSetDevice(dev));
    void *p[100];
    for (int i = 0; i < 100; i++) CK(cudaMalloc(&p[i], 4096));
    pthread_barrier_wait(&bar); /* main checks */
    pthread_barrier_wait(&bar);
    for (int i = 0; i < 100; i++) CK(cudaFree(p[i]));
    return NULL;
}

int main(void) {
    vs_init();
    int n = 0;
    CK(cudaGetDeviceCount(&n));
    EXPECT(n == 2);

    void *a, *b, *c;
    CK(cudaMalloc(&a, 1 * MiB)); /* device 0: no cudaSetDevice yet */
    EXPECT_VS("live_bytes.0", 1 * MiB);
    CK(cudaSetDevice(1));
    CK(cudaMalloc(&b, 2 * MiB));
    EXPECT_VS("live_bytes.1", 2 * MiB);
    EXPECT_VS("live_bytes.0", 1 * MiB);
    CK(cudaSetDevice(0));
    CK(cudaMalloc(&c, 4 * MiB));
    EXPECT_VS("live_bytes.0", 5 * MiB);
    EXPECT_VS("live_bytes.1", 2 * MiB);

    /* cudaSetDevice found with dlsym, as frameworks and ctypes do */
    void *rt = dlopen("libcudart.so.12", RTLD_NOW | RTLD_NOLOAD);
    EXPECT(rt != NULL);
    int (*set)(int) = (int (*)(int))dlsym(rt, "cudaSetDevice");
    EXPECT(set != NULL);
    CK(set(1));
    void *d;
    CK(cudaMalloc(&d, 8 * MiB));
    EXPECT_VS("live_bytes.1", 10 * MiB);
    CK(set(0));
    CK(cudaFree(d)); /* a free goes by the pointer, whatever the current device */
    EXPECT_VS("live_bytes.1", 2 * MiB);

    /* threads on different devices at once: each thread has its own current device */
    pthread_barrier_init(&bar, NULL, 5);
    pthread_t th[4];
    long devs[4] = {1, 0, 1, -1};
    for (int t = 0; t < 4; t++) pthread_create(&th[t], NULL, on_device, (void *)devs[t]);
    pthread_barrier_wait(&bar);
    EXPECT_VS("live_bytes.1", 2 * MiB + 2 * 100 * 4096);
    EXPECT_VS("live_bytes.0", 5 * MiB + 2 * 100 * 4096);
    pthread_barrier_wait(&bar);
    for (int t = 0; t < 4; t++) pthread_join(th[t], NULL);

    /* this thread is still on device 0 */
    void *e;
    CK(cudaMalloc(&e, 16 * MiB));
    EXPECT_VS("live_bytes.0", 21 * MiB);
    EXPECT_VS("live_bytes.1", 2 * MiB);

    CK(cudaFree(a));
    CK(cudaFree(b));
    CK(cudaFree(c));
    CK(cudaFree(e));
    EXPECT_VS("live_bytes.0", 0);
    EXPECT_VS("live_bytes.1", 0);
    printf("device_switch: ok\n");
    return 0;
}
