/*
 * nvcheck.c - the simulated NVML against the simulated driver: what NVML reports is the
 * device's own accounting of every process. `nvcheck HOLD_MIB` allocates HOLD_MIB through
 * libcuda.so.1 (0: no CUDA at all), then prints NVML's view.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; unsigned int gi, ci; } nvmlProcessInfo_t;
#define nvmlMemory_v2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2 << 24)))

#define EXPECT_EQ(call, want)                                                                  \
    do {                                                                                       \
        long long g_ = (long long)(call), w_ = (long long)(want);                              \
        if (g_ != w_) {                                                                        \
            fprintf(stderr, "%s:%d: %s -> %lld, expected %lld\n", __FILE__, __LINE__, #call,   \
                    g_, w_);                                                                   \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)
#define OK(call) EXPECT_EQ(call, 0)

static void *sym(void *h, const char *n) {
    void *f = dlsym(h, n);
    if (!f) { fprintf(stderr, "missing %s\n", n); exit(1); }
    return f;
}

static void hold_memory(long hold) {
    if (hold > 0) {
        void *cu = dlopen("libcuda.so.1", RTLD_NOW);
        if (!cu) { fprintf(stderr, "%s\n", dlerror()); exit(1); }
        int (*cuInit)(unsigned) = sym(cu, "cuInit");
        int (*retain)(void **, int) = sym(cu, "cuDevicePrimaryCtxRetain");
        int (*setcur)(void *) = sym(cu, "cuCtxSetCurrent");
        int (*alloc)(unsigned long long *, size_t) = sym(cu, "cuMemAlloc_v2");
        void *ctx;
        unsigned long long p;
        OK(cuInit(0));
        OK(retain(&ctx, 0));
        OK(setcur(ctx));
        OK(alloc(&p, (size_t)hold << 20));
    }
}

/* nvmlGetMemoryLimits_v1_t / nvmlSetMemoryLimits_v1_t, as NVIDIA's bindings lay them out. */
typedef struct { char *nameSpace; unsigned long long softLimit, hardLimit, currentUsed; } nvmlMemoryLimits_v1_t;

/* nvcheck limits: NVML's memory limits of device 0 and 1, then device 0's after a set. */
static int limits(void *nv) {
    int (*init)(void) = sym(nv, "nvmlInit_v2");
    int (*by_index)(unsigned, void **) = sym(nv, "nvmlDeviceGetHandleByIndex_v2");
    int (*get)(void *, nvmlMemoryLimits_v1_t *) = sym(nv, "nvmlDeviceGetMemoryLimits_v1");
    int (*set)(void *, const nvmlMemoryLimits_v1_t *) = sym(nv, "nvmlDeviceSetMemoryLimits_v1");
    void *h0, *h1;
    OK(init());
    OK(by_index(0, &h0));
    OK(by_index(1, &h1));
    nvmlMemoryLimits_v1_t l = {0};
    int rc = get(h0, &l);
    printf("get0=%d soft=%llu hard=%llu\n", rc, l.softLimit, l.hardLimit);
    memset(&l, 0, sizeof l);
    printf("get1=%d\n", get(h1, &l));
    EXPECT_EQ(get(h0, NULL), 2);
    nvmlMemoryLimits_v1_t bad = {NULL, 3 << 20, 2 << 20, 0};
    EXPECT_EQ(set(h0, &bad), 2);
    nvmlMemoryLimits_v1_t s = {NULL, 1 << 20, 2 << 20, 0};
    OK(set(h0, &s));
    memset(&l, 0, sizeof l);
    OK(get(h0, &l));
    printf("after soft=%llu hard=%llu\n", l.softLimit, l.hardLimit);
    return 0;
}

/* nvcheck HOLD_MIB [nvml-first]: with nvml-first, NVML is initialised before the driver loads. */
int main(int argc, char **argv) {
    long hold = argc > 1 ? atol(argv[1]) : 0;
    int nvml_first = argc > 2 && !strcmp(argv[2], "nvml-first");
    void *nv = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!nv) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    if (argc > 1 && !strcmp(argv[1], "limits")) return limits(nv);
    int (*init)(void) = sym(nv, "nvmlInit_v2");
    if (nvml_first) {
        OK(init());
        hold_memory(hold);
    } else {
        hold_memory(hold);
    }
    int (*shutdown)(void) = sym(nv, "nvmlShutdown");
    int (*count)(unsigned *) = sym(nv, "nvmlDeviceGetCount_v2");
    int (*byidx)(unsigned, void **) = sym(nv, "nvmlDeviceGetHandleByIndex_v2");
    int (*name)(void *, char *, unsigned) = sym(nv, "nvmlDeviceGetName");
    int (*uuid)(void *, char *, unsigned) = sym(nv, "nvmlDeviceGetUUID");
    int (*mem)(void *, nvmlMemory_t *) = sym(nv, "nvmlDeviceGetMemoryInfo");
    int (*mem2)(void *, nvmlMemory_v2_t *) = sym(nv, "nvmlDeviceGetMemoryInfo_v2");
    int (*procs)(void *, unsigned *, nvmlProcessInfo_t *) = sym(nv, "nvmlDeviceGetComputeRunningProcesses_v3");
    int (*drv)(char *, unsigned) = sym(nv, "nvmlSystemGetDriverVersion");
    const char *(*errstr)(int) = sym(nv, "nvmlErrorString");
    unsigned n;
    void *dev;
    if (!nvml_first) EXPECT_EQ(count(&n), 1); /* before init: uninitialized */
    OK(init());
    OK(count(&n));
    EXPECT_EQ(byidx(n, &dev), 2);
    OK(byidx(0, &dev));
    char buf[96];
    OK(name(dev, buf, sizeof buf));
    printf("name %s\n", buf);
    EXPECT_EQ(name(dev, buf, 4), 7);
    OK(uuid(dev, buf, sizeof buf));
    printf("uuid %s\n", buf);
    OK(drv(buf, sizeof buf));
    nvmlMemory_t m;
    OK(mem(dev, &m));
    EXPECT_EQ(m.total, m.free + m.used);
    nvmlMemory_v2_t m2;
    memset(&m2, 0, sizeof m2);
    EXPECT_EQ(mem2(dev, &m2), 25); /* version not set */
    m2.version = nvmlMemory_v2;
    OK(mem2(dev, &m2));
    EXPECT_EQ(m2.used, m.used);
    EXPECT_EQ(m2.total, m.total);
    EXPECT_EQ(m2.reserved, 0);
    nvmlProcessInfo_t infos[8];
    unsigned np = 8;
    OK(procs(dev, &np, infos));
    printf("count %u\ntotal %llu\nfree %llu\nused %llu\nprocs %u\n", n, m.total, m.free, m.used, np);
    EXPECT_EQ(mem(dev, NULL), 2);
    EXPECT_EQ(strcmp(errstr(2), "Invalid Argument"), 0);
    OK(shutdown());
    if (nvml_first) OK(shutdown());
    EXPECT_EQ(mem(dev, &m), 1); /* after the last shutdown */
    return 0;
}
