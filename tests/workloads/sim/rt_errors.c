/* rt_errors: error codes and the per-thread last-error semantics of the runtime.
 * Prints "rt_errors: ok". Argument "panic" also checks that a panic inside the runtime
 * comes back as cudaErrorUnknown (cuda-sim only). */
#include <pthread.h>
#include <string.h>
#include "check.h"

cudaError_t vramsimRuntimeSelfTestPanic(void);

static void *other_thread(void *arg) {
    (void)arg;
    /* the last error is per thread: this thread has none */
    EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess);
    void *p;
    EXPECT_EQ(cudaMalloc(&p, (size_t)1 << 60), cudaErrorMemoryAllocation);
    return NULL;
}

int main(int argc, char **argv) {
    void *p = NULL;
    CK(cudaSetDevice(0));
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);

    /* out of memory: code 2, recorded as last error */
    EXPECT_EQ(cudaMalloc(&p, (size_t)1 << 60), cudaErrorMemoryAllocation);
    /* a later successful call does not clear it */
    void *ok = NULL;
    CK(cudaMalloc(&ok, 4096));
    EXPECT_EQ(cudaPeekAtLastError(), cudaErrorMemoryAllocation);
    EXPECT_EQ(cudaPeekAtLastError(), cudaErrorMemoryAllocation); /* peek does not reset */
    EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);    /* get resets */
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);

    /* the last error is per thread */
    EXPECT_EQ(cudaMalloc(&p, (size_t)1 << 60), cudaErrorMemoryAllocation);
    pthread_t t;
    pthread_create(&t, NULL, other_thread, NULL);
    pthread_join(t, NULL);
    EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);

    /* the latest failure wins */
    EXPECT_EQ(cudaMalloc(&p, (size_t)1 << 60), cudaErrorMemoryAllocation);
    EXPECT_EQ(cudaSetDevice(99), cudaErrorInvalidDevice);
    EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidDevice);

    /* bad input */
    EXPECT_EQ(cudaMalloc(NULL, 16), cudaErrorInvalidValue);
    EXPECT_EQ(cudaSetDevice(-1), cudaErrorInvalidDevice);
    static unsigned char prop[4096];
    EXPECT_EQ(cudaGetDeviceProperties((struct cudaDeviceProp *)prop, 99), cudaErrorInvalidDevice);
    int v;
    EXPECT_EQ(cudaDeviceGetAttribute(&v, cudaDevAttrWarpSize, 42), cudaErrorInvalidDevice);
    EXPECT_EQ(cudaMemcpy(ok, ok, 16, (enum cudaMemcpyKind)17), cudaErrorInvalidMemcpyDirection);
    int stack_var = 0;
    EXPECT_EQ(cudaFree(&stack_var), cudaErrorInvalidValue); /* not device memory */
    CK(cudaFree(ok));
    EXPECT_EQ(cudaFree(ok), cudaErrorInvalidValue); /* double free */
    EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);

    /* IPC handles only for cudaMalloc memory */
    cudaIpcMemHandle_t h;
    EXPECT_EQ(cudaIpcGetMemHandle(&h, &stack_var), cudaErrorInvalidValue);
    (void)cudaGetLastError();

    /* names and strings */
    EXPECT(strcmp(cudaGetErrorName(cudaErrorMemoryAllocation), "cudaErrorMemoryAllocation") == 0);
    EXPECT(strcmp(cudaGetErrorString(cudaErrorMemoryAllocation), "out of memory") == 0);
    EXPECT(strcmp(cudaGetErrorName(cudaErrorInvalidValue), "cudaErrorInvalidValue") == 0);
    EXPECT(strcmp(cudaGetErrorString((cudaError_t)12345), "unrecognized error code") == 0);

    /* not-ready is a status, not an error */
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    CK(cudaStreamSynchronize(s));
    CK(cudaStreamQuery(s));
    CK(cudaStreamDestroy(s));
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);

    if (argc > 1 && strcmp(argv[1], "panic") == 0) {
        EXPECT_EQ(vramsimRuntimeSelfTestPanic(), cudaErrorUnknown);
        EXPECT_EQ(cudaGetLastError(), cudaErrorUnknown);
        CK(cudaMalloc(&ok, 16)); /* the runtime still works */
        CK(cudaFree(ok));
    }
    printf("rt_errors: ok\n");
    return 0;
}
