/* no_driver: with no loadable libcuda.so.1 every runtime call returns
 * cudaErrorInsufficientDriver (35) and cudaDriverGetVersion reports version 0. */
#include "check.h"

int main(void) {
    int dv = -1, rv = 0, n = -1;
    void *p = (void *)1;
    size_t f, t;
    EXPECT_EQ(cudaDriverGetVersion(&dv), cudaSuccess);
    EXPECT_EQ(dv, 0);
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
