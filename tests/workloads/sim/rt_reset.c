/* rt_reset: cudaDeviceReset destroys the context's allocations (their memory comes back) and
 * the next call sets the device up again. Prints "rt_reset: ok". */
#include "check.h"

int main(void) {
    size_t free0, free1, free2, total;
    void *p = NULL;
    CK(cudaSetDevice(0));
    CK(cudaMemGetInfo(&free0, &total));
    CK(cudaMalloc(&p, 64 << 20));
    CK(cudaMemGetInfo(&free1, &total));
    EXPECT(free1 + (64 << 20) <= free0);
    CK(cudaDeviceReset());
    CK(cudaMemGetInfo(&free2, &total)); /* re-initializes the device */
    EXPECT_EQ(free2, free0);
    EXPECT_EQ(cudaFree(p), cudaErrorInvalidValue); /* gone with the context */
    (void)cudaGetLastError();
    CK(cudaMalloc(&p, 1 << 20));
    CK(cudaFree(p));
    printf("rt_reset: ok\n");
    return 0;
}
