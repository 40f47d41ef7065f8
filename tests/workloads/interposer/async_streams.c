/* async_streams: stream-ordered allocation on several streams, plain and _ptsz, and from
 * the device's default pool; the live table follows every stream. */
#include <string.h>
#include "check.h"
#include "vs.h"

#define S 4
#define PER 8

int main(void) {
    vs_init();
    cudaStream_t s[S];
    for (int i = 0; i < S; i++) CK(cudaStreamCreateWithFlags(&s[i], cudaStreamNonBlocking));
    void *p[S][PER];
    unsigned long long bytes = 0;
    for (int j = 0; j < PER; j++)
        for (int i = 0; i < S; i++) {
            size_t sz = 4096u * (size_t)(1 + i + S * j);
            if (j % 2)
                CK(cudaMallocAsync_ptsz(&p[i][j], sz, s[i]));
            else
                CK(cudaMallocAsync(&p[i][j], sz, s[i]));
            CK(vramsimKernelFill(p[i][j], (unsigned char)(i + j), sz, 50, s[i]));
            bytes += sz;
        }
    cudaMemPool_t pool;
    CK(cudaDeviceGetDefaultMemPool(&pool, 0));
    void *q, *q2;
    CK(cudaMallocFromPoolAsync(&q, 12345, pool, s[0]));
    CK(cudaMallocFromPoolAsync_ptsz(&q2, 777, pool, cudaStreamPerThread));
    bytes += 12345 + 777;
    EXPECT_VS("live_count.0.async", S * PER + 2);
    EXPECT_VS("live_bytes.0", bytes);
    EXPECT_VS("calls.cudaMallocAsync", S * PER);
    EXPECT_VS("calls.cudaMallocFromPoolAsync", 2);
    EXPECT_VS("calls.cuMemAllocAsync", 0);

    for (int i = 0; i < S; i++) CK(cudaStreamSynchronize(s[i]));
    unsigned char b[16];
    CK(cudaMemcpy(b, p[2][3], sizeof b, cudaMemcpyDeviceToHost));
    EXPECT(b[0] == 5 && b[15] == 5);

    /* free on the allocating stream and on another one */
    for (int j = 0; j < PER; j++)
        for (int i = 0; i < S; i++) {
            if (j % 2)
                CK(cudaFreeAsync_ptsz(p[i][j], s[(i + 1) % S]));
            else
                CK(cudaFreeAsync(p[i][j], s[i]));
        }
    CK(cudaFreeAsync(q, s[0]));
    CK(cudaFreeAsync(q2, cudaStreamPerThread));
    for (int i = 0; i < S; i++) CK(cudaStreamSynchronize(s[i]));
    CK(cudaStreamSynchronize(cudaStreamPerThread));
    EXPECT_VS("live_bytes.0", 0);
    EXPECT_VS("live_entries", 0);
    EXPECT_VS("calls.cudaFreeAsync", S * PER + 2);
    EXPECT_VS("peak_bytes.0", bytes);
    EXPECT_VS("unknown_frees", 0);
    for (int i = 0; i < S; i++) CK(cudaStreamDestroy(s[i]));
    printf("async_streams: ok\n");
    return 0;
}
