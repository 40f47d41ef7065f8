/* no_driver [DRIVER_VERSION]: with no loadable libcuda.so.1 (or one older than the runtime)
 * every runtime call returns cudaErrorInsufficientDriver (35) and cudaDriverGetVersion reports
 * DRIVER_VERSION (default 0: no driver). */
#include <stdlib.h>
#include "check.h"

int main(int argc, char **argv) {
    int want_dv = argc > 1 ? atoi(argv[1]) : 0;
    int dv = -1, rv = 0, n = -1;
    void *p = (void *)1;
    size_t f, t;
    EXPECT_EQ(cudaDriverGetVersion(&dv), cudaSuccess);
    EXPECT_EQ(dv, want_dv);
    EXPECT_EQ(cudaRuntimeGetVersion(&rv), cudaSuccess);
    EXPECT(rv >= 12000);
    EXPECT_EQ(cudaMalloc(&p, 16), cudaErrorInsufficientDriver);
    EXPECT_EQ(cudaMemGetInfo(&f, &t), cudaErrorInsufficientDriver);
    EXPECT_EQ(cudaFree(NULL), cudaErrorInsufficientDriver);
    EXPECT_EQ(cudaGetDeviceCount(&n), cudaErrorInsufficientDriver);
    EXPECT_EQ(cudaGetLastError(), cudaErrorInsufficientDriver);
    printf("no_driver: ok\n");
    return 0;
}
