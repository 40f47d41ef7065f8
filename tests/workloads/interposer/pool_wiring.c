/* pool_wiring: with VRAMSHIM_POOL=stitch the plain allocation paths are served by the pool
 * (counted as pooled, kind "pool"), data is intact, frees go back to the pool, a device
 * synchronization is seen, legacy IPC on pool memory is refused with an error, and paths the
 * pool does not serve (managed) still go to the driver. Without a pool layer (or with
 * VRAMSHIM_POOL unset) it behaves as plain CUDA. */
#include <string.h>
#include "check.h"
#include "vs.h"

#define N 8

int main(void) {
    int pre = vs_init();
    void *p[N];
    unsigned long long bytes = 0;
    for (int i = 0; i < N; i++) {
        size_t sz = (size_t)(i + 1) * 300000u;
        CK(cudaMalloc(&p[i], sz));
        CK(cudaMemset(p[i], i + 1, sz));
        bytes += sz;
    }
    unsigned char b[4];
    CK(cudaMemcpy(b, (char *)p[5] + 1000, 4, cudaMemcpyDeviceToHost));
    EXPECT(b[0] == 6 && b[3] == 6);
    EXPECT_VS("live_bytes.0", bytes);
    long long pooled = VS("pooled");
    cudaIpcMemHandle_t h;
    int ipc = (int)cudaIpcGetMemHandle(&h, p[0]);
    (void)cudaGetLastError();
    void *m;
    CK(cudaMallocManaged(&m, 4096, cudaMemAttachGlobal));
    EXPECT_VS("live_count.0.managed", 1);
    for (int i = 0; i < N; i++) CK(cudaFree(p[i]));
    CK(cudaFree(m));
    CK(cudaDeviceSynchronize());
    /* reuse after the synchronization */
    for (int i = 0; i < N; i++) CK(cudaMalloc(&p[i], (size_t)(i + 1) * 300000u));
    for (int i = 0; i < N; i++) CK(cudaFree(p[i]));
    EXPECT_VS("live_bytes.0", 0);
    EXPECT_VS("live_entries", 0);
    EXPECT_VS("unknown_frees", 0);
    fprintf(stderr, "pool_wiring: preloaded=%d pooled=%lld ipc=%d\n", pre, pooled, ipc);
    printf("pool_wiring: ok pooled=%s ipc=%s\n", pooled > 0 ? "yes" : "no", ipc ? "refused" : "allowed");
    return 0;
}
