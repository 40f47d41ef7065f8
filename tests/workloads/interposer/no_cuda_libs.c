/* no_cuda_libs: a process with no CUDA library at all calls our exported hooks (found with
 * dlsym(RTLD_DEFAULT)): each returns what CUDA itself says without a driver, nothing crashes.
 * Run without LD_LIBRARY_PATH to any CUDA. */
#include <dlfcn.h>
#include <stdio.h>
#include <stddef.h>

int main(void) {
    int (*cm)(void **, size_t) = dlsym(RTLD_DEFAULT, "cudaMalloc");
    int (*cf)(void *) = dlsym(RTLD_DEFAULT, "cudaFree");
    int (*cmi)(size_t *, size_t *) = dlsym(RTLD_DEFAULT, "cudaMemGetInfo");
    int (*dm)(unsigned long long *, size_t) = dlsym(RTLD_DEFAULT, "cuMemAlloc_v2");
    int (*dmi)(size_t *, size_t *) = dlsym(RTLD_DEFAULT, "cuMemGetInfo_v2");
    int (*gpa)(const char *, void **, int, unsigned long long, int *) =
        dlsym(RTLD_DEFAULT, "cuGetProcAddress_v2");
    int (*nv)(void *, void *) = dlsym(RTLD_DEFAULT, "nvmlDeviceGetMemoryInfo");
    if (!cm || !cf || !cmi || !dm || !dmi || !gpa || !nv) {
        printf("hooks absent\n");
        return 0;
    }
    void *p = NULL;
    size_t f = 0, t = 0;
    unsigned long long d = 0;
    void *fn = NULL;
    char mem[64];
    printf("cudaMalloc -> %d\n", cm(&p, 100));
    printf("cudaFree -> %d\n", cf(p));
    printf("cudaMemGetInfo -> %d\n", cmi(&f, &t));
    printf("cuMemAlloc_v2 -> %d\n", dm(&d, 100));
    printf("cuMemGetInfo_v2 -> %d\n", dmi(&f, &t));
    printf("cuGetProcAddress_v2 -> %d\n", gpa("cuMemAlloc", &fn, 12000, 0, NULL));
    printf("nvmlDeviceGetMemoryInfo -> %d\n", nv(NULL, mem));
    return 0;
}
