/* dl_runtime LIB VERSION_NODE: dlopens a CUDA runtime (e.g. libcudart.so.12), resolves its
 * functions with dlvsym(h, name, VERSION_NODE) as a program built against that version would,
 * allocates, copies and frees. Prints "dl_runtime: ok". */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <string.h>
#include "check.h"

int main(int argc, char **argv) {
    const char *lib = argc > 1 ? argv[1] : "libcudart.so.12";
    const char *node = argc > 2 ? argv[2] : "libcudart.so.12";
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) { fprintf(stderr, "dlopen %s: %s\n", lib, dlerror()); return 1; }
    cudaError_t (*mal)(void **, size_t) = (cudaError_t (*)(void **, size_t))dlvsym(h, "cudaMalloc", node);
    cudaError_t (*fr)(void *) = (cudaError_t (*)(void *))dlvsym(h, "cudaFree", node);
    cudaError_t (*cpy)(void *, const void *, size_t, enum cudaMemcpyKind) =
        (cudaError_t (*)(void *, const void *, size_t, enum cudaMemcpyKind))dlvsym(h, "cudaMemcpy", node);
    cudaError_t (*ver)(int *) = (cudaError_t (*)(int *))dlvsym(h, "cudaRuntimeGetVersion", node);
    EXPECT(mal && fr && cpy && ver);
    EXPECT(dlvsym(h, "cudaMalloc", "NO_SUCH_NODE") == NULL);
    int v = 0;
    EXPECT_EQ(ver(&v), cudaSuccess);
    void *d = NULL;
    EXPECT_EQ(mal(&d, 1 << 20), cudaSuccess);
    char in[64] = "hello device", out[64] = {0};
    EXPECT_EQ(cpy(d, in, sizeof in, cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(cpy(out, d, sizeof out, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT(strcmp(in, out) == 0);
    EXPECT_EQ(fr(d), cudaSuccess);
    printf("runtime=%d\ndl_runtime: ok\n", v);
    return 0;
}
