/* A plain cuBLAS program on the simulated GPU: cublasCreate, cublasSgemm on device buffers,
 * a synchronization, cublasDestroy. Kernels do not run on cuda-sim, so C's contents are not
 * checked: the program must complete, every call succeeding. Declares what it uses itself
 * (cuBLAS's `_v2` entry points, as cublas_v2.h maps them).
 *
 * Prints `step <name>` before each call, `status <name> <code>` for a failed one (exit 1),
 * `map <path>` for mapped CUDA libraries and `done` at the end. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void *cublasHandle_t;
extern int cublasCreate_v2(cublasHandle_t *h);
extern int cublasDestroy_v2(cublasHandle_t h);
extern int cublasSgemm_v2(cublasHandle_t h, int ta, int tb, int m, int n, int k,
                          const float *alpha, const float *a, int lda, const float *b, int ldb,
                          const float *beta, float *c, int ldc);
extern int cudaMalloc(void **p, size_t n);
extern int cudaFree(void *p);
extern int cudaMemcpy(void *dst, const void *src, size_t n, int kind);
extern int cudaDeviceSynchronize(void);

#define CALL(name, call)                                                                     \
    do {                                                                                     \
        printf("step %s\n", name);                                                           \
        fflush(stdout);                                                                      \
        int rc_ = (call);                                                                    \
        if (rc_ != 0) {                                                                      \
            printf("status %s %d\n", name, rc_);                                             \
            return 1;                                                                        \
        }                                                                                    \
    } while (0)

static void print_maps(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    char line[4096], last[4096] = "";
    if (!f) return;
    while (fgets(line, sizeof line, f)) {
        char *path = strchr(line, '/');
        if (!path) continue;
        path[strcspn(path, "\n")] = 0;
        if ((strstr(path, "cudart") || strstr(path, "libcuda") || strstr(path, "cublas") ||
             strstr(path, "vramsim")) && strcmp(path, last) != 0) {
            printf("map %s\n", path);
            snprintf(last, sizeof last, "%s", path);
        }
    }
    fclose(f);
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 64, rounds = argc > 2 ? atoi(argv[2]) : 2;
    size_t bytes = (size_t)n * n * sizeof(float);
    float *h = malloc(bytes), alpha = 1.0f, beta = 0.0f;
    for (int i = 0; i < n * n; i++) h[i] = (float)(i % 7);
    cublasHandle_t handle;
    float *a, *b, *c;
    CALL("cublasCreate", cublasCreate_v2(&handle));
    CALL("cudaMalloc", cudaMalloc((void **)&a, bytes));
    CALL("cudaMalloc", cudaMalloc((void **)&b, bytes));
    CALL("cudaMalloc", cudaMalloc((void **)&c, bytes));
    CALL("cudaMemcpy", cudaMemcpy(a, h, bytes, 1));
    CALL("cudaMemcpy", cudaMemcpy(b, h, bytes, 1));
    for (int r = 0; r < rounds; r++)
        CALL("cublasSgemm", cublasSgemm_v2(handle, 0, 0, n, n, n, &alpha, a, n, b, n, &beta, c, n));
    CALL("cudaDeviceSynchronize", cudaDeviceSynchronize());
    CALL("cudaMemcpy", cudaMemcpy(h, c, bytes, 2));
    CALL("cudaFree", cudaFree(a));
    CALL("cudaFree", cudaFree(b));
    CALL("cudaFree", cudaFree(c));
    CALL("cublasDestroy", cublasDestroy_v2(handle));
    print_maps();
    printf("done\n");
    return 0;
}
