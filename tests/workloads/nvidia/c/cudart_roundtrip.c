/* Round trips through NVIDIA's own CUDA runtime (libcudart.so.12/13 from the wheels, or their
 * libcudart_static.a linked in), run on cuda-sim's libcuda.so.1: device count, memGetInfo,
 * allocations, copies both ways with the data compared, frees. Declares the few runtime
 * functions it uses itself, so that one source builds against either major version.
 *
 * Prints `key value` lines for the test (tests/workloads/nvidia/tests/runtime.rs), then every mapped file whose
 * name contains "cudart" or "libcuda" as `map <path>`. Exit 0 on success; on a failed call it
 * prints the call, the code and the runtime's message, and exits 1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int cudaError_t;
extern cudaError_t cudaGetDeviceCount(int *count);
extern cudaError_t cudaRuntimeGetVersion(int *v);
extern cudaError_t cudaDriverGetVersion(int *v);
extern cudaError_t cudaMalloc(void **p, size_t n);
extern cudaError_t cudaFree(void *p);
extern cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, int kind);
extern cudaError_t cudaMemGetInfo(size_t *free, size_t *total);
extern cudaError_t cudaDeviceSynchronize(void);
extern const char *cudaGetErrorString(cudaError_t e);

#define H2D 1
#define D2H 2
#define D2D 3

#define CHECK(call)                                                                          \
    do {                                                                                     \
        cudaError_t rc_ = (call);                                                            \
        if (rc_ != 0) {                                                                      \
            printf("error %s -> %d (%s)\n", #call, rc_, cudaGetErrorString(rc_));            \
            fflush(stdout);                                                                  \
            exit(1);                                                                         \
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
        if ((strstr(path, "cudart") || strstr(path, "libcuda") || strstr(path, "vramsim")) &&
            strcmp(path, last) != 0) {
            printf("map %s\n", path);
            snprintf(last, sizeof last, "%s", path);
        }
    }
    fclose(f);
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 4;           /* allocations */
    size_t bytes = argc > 2 ? strtoull(argv[2], 0, 0) : (1 << 20);
    int count = 0, rv = 0, dv = 0;
    size_t free0, total, free1, free2;
    CHECK(cudaGetDeviceCount(&count));
    CHECK(cudaRuntimeGetVersion(&rv));
    CHECK(cudaDriverGetVersion(&dv));
    printf("devices %d\nruntime_version %d\ndriver_version %d\n", count, rv, dv);
    CHECK(cudaMemGetInfo(&free0, &total));
    void **d = calloc(n, sizeof *d);
    unsigned char *h = malloc(bytes), *back = malloc(bytes);
    for (int i = 0; i < n; i++) {
        CHECK(cudaMalloc(&d[i], bytes));
        for (size_t j = 0; j < bytes; j++) h[j] = (unsigned char)(j * 31 + i * 7);
        CHECK(cudaMemcpy(d[i], h, bytes, H2D));
    }
    CHECK(cudaMemGetInfo(&free1, &total));
    int bad = 0;
    for (int i = 0; i < n; i++) {
        void *tmp;
        CHECK(cudaMalloc(&tmp, bytes));
        CHECK(cudaMemcpy(tmp, d[i], bytes, D2D));
        CHECK(cudaMemcpy(back, tmp, bytes, D2H));
        CHECK(cudaFree(tmp));
        for (size_t j = 0; j < bytes; j++)
            if (back[j] != (unsigned char)(j * 31 + i * 7)) { bad++; break; }
    }
    for (int i = 0; i < n; i++) CHECK(cudaFree(d[i]));
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemGetInfo(&free2, &total));
    printf("total %zu\nfree_before %zu\nfree_allocated %zu\nfree_after %zu\ncorrupt %d\n",
           total, free0, free1, free2, bad);
    print_maps();
    printf("done\n");
    return bad ? 1 : 0;
}
