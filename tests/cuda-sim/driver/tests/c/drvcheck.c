/*
 * drvcheck.c - scenarios for the simulated driver's integration tests. Reaches libcuda.so.1
 * as the real runtime does (dlopen + cuGetProcAddress_v2). `drvcheck SCENARIO [ARGS]`; exit 0
 * on success, 1 with a message on the first failed expectation.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long u64;
typedef void *CUcontext, *CUstream, *CUevent, *CUmemoryPool;
typedef struct { int type, id; } CUmemLocation;
typedef struct {
    int type, requestedHandleTypes;
    CUmemLocation location;
    void *win32;
    unsigned char flags[8];
} CUmemAllocationProp;
typedef struct { CUmemLocation location; int flags; } CUmemAccessDesc;
typedef struct { u64 capacity, used, high_water, refusals, used_by_self; } Stats;
typedef CUresult (*gpa_t)(const char *, void **, int, u64, int *);

static void *lib;
static gpa_t gpa;

#define EXPECT_EQ(call, want)                                                                  \
    do {                                                                                       \
        long long g_ = (long long)(call), w_ = (long long)(want);                              \
        if (g_ != w_) {                                                                        \
            fprintf(stderr, "%s:%d: %s -> %lld, expected %lld\n", __FILE__, __LINE__, #call,   \
                    g_, w_);                                                                   \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)
#define EXPECT(c)                                                                              \
    do {                                                                                       \
        if (!(c)) {                                                                            \
            fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #c);                   \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)
#define OK(call) EXPECT_EQ(call, 0)

static void *get(const char *name, int ver, u64 flags) {
    void *f = NULL;
    int st = -1;
    CUresult r = gpa(name, &f, ver, flags, &st);
    if (r != 0 || !f) {
        fprintf(stderr, "cuGetProcAddress_v2(%s, %d, %llu) -> %d status %d\n", name, ver, flags, r, st);
        exit(1);
    }
    return f;
}
#define V 12080
#define FN(ret, name, args) ret(*name) args = get(#name, V, 0)

static CUresult (*cuInit) (unsigned);
static CUresult (*cuDeviceGet)(int *, int);
static CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, int);
static CUresult (*cuCtxSetCurrent)(CUcontext);
static CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
static CUresult (*cuMemFree)(CUdeviceptr);
static CUresult (*cuMemGetInfo)(size_t *, size_t *);
static CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void *, size_t);
static CUresult (*cuMemcpyDtoH)(void *, CUdeviceptr, size_t);
static CUresult (*vramsimDeviceUsed)(int, u64 *);
static CUresult (*vramsimDeviceHighWater)(int, u64 *);

static void load(void) {
    lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) { fprintf(stderr, "dlopen: %s\n", dlerror()); exit(1); }
    gpa = (gpa_t)dlsym(lib, "cuGetProcAddress_v2");
    EXPECT(gpa);
    cuInit = get("cuInit", V, 0);
    cuDeviceGet = get("cuDeviceGet", V, 0);
    cuDevicePrimaryCtxRetain = get("cuDevicePrimaryCtxRetain", V, 0);
    cuCtxSetCurrent = get("cuCtxSetCurrent", V, 0);
    cuMemAlloc = get("cuMemAlloc", V, 0);
    cuMemFree = get("cuMemFree", V, 0);
    cuMemGetInfo = get("cuMemGetInfo", V, 0);
    cuMemcpyHtoD = get("cuMemcpyHtoD", V, 0);
    cuMemcpyDtoH = get("cuMemcpyDtoH", V, 0);
    vramsimDeviceUsed = get("vramsimDeviceUsed", V, 0);
    vramsimDeviceHighWater = get("vramsimDeviceHighWater", V, 0);
}

static void start(void) {
    OK(cuInit(0));
    int dev;
    CUcontext ctx;
    OK(cuDeviceGet(&dev, 0));
    OK(cuDevicePrimaryCtxRetain(&ctx, dev));
    OK(cuCtxSetCurrent(ctx));
}

static size_t free_mem(void) {
    size_t f, t;
    OK(cuMemGetInfo(&f, &t));
    return f;
}

#define MiB (1ull << 20)

/* Error codes, packing, copies. Run with VRAMSIM_CONTEXT_OVERHEAD=300MiB (default). */
static int basic(void) {
    CUdeviceptr p, q;
    size_t f, t;
    int n;
    CUresult (*cuDeviceGetCount)(int *) = get("cuDeviceGetCount", V, 0);
    CUresult (*cuMemGetAddressRange)(CUdeviceptr *, size_t *, CUdeviceptr) = get("cuMemGetAddressRange", V, 0);
    CUresult (*cuGetErrorName)(CUresult, const char **) = get("cuGetErrorName", V, 0);
    CUresult (*cuCtxGetCurrent)(CUcontext *) = get("cuCtxGetCurrent", V, 0);
    int drv = 0;
    CUresult (*cuDriverGetVersion)(int *) = get("cuDriverGetVersion", V, 0);
    OK(cuDriverGetVersion(&drv));
    EXPECT_EQ(drv, 13000);
    /* Before cuInit. */
    EXPECT_EQ(cuDeviceGetCount(&n), 3);
    EXPECT_EQ(cuMemAlloc(&p, 100), 3);
    EXPECT_EQ(cuInit(1), 1);
    OK(cuInit(0));
    OK(cuDeviceGetCount(&n));
    EXPECT_EQ(n, 2); /* VRAMSIM_DEVICES=2 */
    int d;
    EXPECT_EQ(cuDeviceGet(&d, 2), 101);
    EXPECT_EQ(cuDeviceGet(&d, -1), 101);
    EXPECT_EQ(cuDeviceGet(NULL, 0), 1);
    /* No current context. */
    CUcontext c = (CUcontext)1;
    OK(cuCtxGetCurrent(&c));
    EXPECT(c == NULL);
    EXPECT_EQ(cuMemAlloc(&p, 100), 201);
    EXPECT_EQ(cuMemGetInfo(&f, &t), 201);
    u64 used0;
    OK(vramsimDeviceUsed(0, &used0));
    EXPECT_EQ(used0, 0);
    start();
    OK(vramsimDeviceUsed(0, &used0));
    EXPECT_EQ(used0, 300 * MiB); /* context overhead */
    OK(cuMemGetInfo(&f, &t));
    EXPECT_EQ(t, 1024 * MiB);
    EXPECT_EQ(f, t - 300 * MiB);
    /* Packing: two small allocations share one 2 MiB page. */
    OK(cuMemAlloc(&p, 1000));
    EXPECT_EQ(free_mem(), f - 2 * MiB);
    OK(cuMemAlloc(&q, 1000));
    EXPECT_EQ(free_mem(), f - 2 * MiB);
    EXPECT(q % 512 == 0 && p % 512 == 0 && q != p);
    EXPECT(q - p < 2 * MiB || p - q < 2 * MiB);
    CUdeviceptr base;
    size_t size;
    OK(cuMemGetAddressRange(&base, &size, p + 10));
    EXPECT_EQ(base, p);
    EXPECT_EQ(size, 1000);
    EXPECT_EQ(cuMemGetAddressRange(&base, &size, 12345), 500);
    /* Copies round-trip. */
    char buf[1000], back[1000];
    for (int i = 0; i < 1000; i++) buf[i] = (char)i;
    OK(cuMemcpyHtoD(p, buf, 1000));
    OK(cuMemcpyDtoH(back, p, 1000));
    EXPECT(memcmp(buf, back, 1000) == 0);
    EXPECT_EQ(cuMemcpyHtoD(p, buf, 5000), 1); /* past the allocation */
    /* A 2D copy: 3 rows of 100 bytes into a 512-byte pitch, and back into a packed buffer. */
    typedef struct {
        size_t srcX, srcY; int srcType; const void *srcHost; CUdeviceptr srcDev; void *srcArr; size_t srcPitch;
        size_t dstX, dstY; int dstType; void *dstHost; CUdeviceptr dstDev; void *dstArr; size_t dstPitch;
        size_t width, height;
    } Copy2D;
    CUresult (*cuMemcpy2D)(const Copy2D *) = get("cuMemcpy2D", V, 0);
    CUdeviceptr pitched;
    OK(cuMemAlloc(&pitched, 3 * 512));
    Copy2D cp2 = {0, 0, 1, buf, 0, NULL, 100, 0, 0, 2, NULL, pitched, NULL, 512, 100, 3};
    OK(cuMemcpy2D(&cp2));
    unsigned char row[100];
    OK(cuMemcpyDtoH(row, pitched + 2 * 512, 100));
    EXPECT(memcmp(row, buf + 200, 100) == 0);
    Copy2D back2 = {0, 0, 2, NULL, pitched, NULL, 512, 0, 0, 1, NULL, 0, NULL, 100, 100, 3};
    memset(back, 0, sizeof back);
    back2.dstHost = back;
    OK(cuMemcpy2D(&back2));
    EXPECT(memcmp(back, buf, 300) == 0);
    cp2.dstPitch = 50;
    EXPECT_EQ(cuMemcpy2D(&cp2), 1);
    OK(cuMemFree(pitched));
    /* Frees. */
    OK(cuMemFree(p));
    EXPECT_EQ(cuMemFree(p), 1); /* double free */
    EXPECT_EQ(cuMemFree(q + 8), 1); /* interior pointer */
    EXPECT_EQ(cuMemFree(0xdeadbeef000), 1);
    OK(cuMemFree(0));
    EXPECT_EQ(free_mem(), f - 2 * MiB);
    OK(cuMemFree(q));
    EXPECT_EQ(free_mem(), f);
    /* Large: rounded up to 2 MiB multiples. */
    OK(cuMemAlloc(&p, 3 * MiB));
    EXPECT_EQ(free_mem(), f - 4 * MiB);
    OK(cuMemFree(p));
    /* Packed up to 1 MiB, pages of its own above (page-aligned, as the driver has them):
     * 1 MiB and 1 KiB share a page; 1 MiB + 1 B takes a page of its own, and so does
     * 2 MiB - 1 B, never shared with a small allocation. */
    OK(cuMemAlloc(&p, MiB));
    OK(cuMemAlloc(&q, 1024));
    EXPECT_EQ(free_mem(), f - 2 * MiB);
    EXPECT_EQ(p & ~(2 * MiB - 1), q & ~(2 * MiB - 1));
    CUdeviceptr big, big2;
    OK(cuMemAlloc(&big, MiB + 1));
    EXPECT_EQ(free_mem(), f - 4 * MiB);
    EXPECT_EQ(big % (2 * MiB), 0);
    OK(cuMemAlloc(&big2, 2 * MiB - 1));
    EXPECT_EQ(free_mem(), f - 6 * MiB);
    EXPECT_EQ(big2 % (2 * MiB), 0);
    OK(cuMemFree(big));
    OK(cuMemFree(big2));
    OK(cuMemFree(p));
    OK(cuMemFree(q));
    EXPECT_EQ(free_mem(), f);
    EXPECT_EQ(cuMemAlloc(&p, 0), 1);
    EXPECT_EQ(cuMemAlloc(NULL, 10), 1);
    /* A panic inside the driver comes back as CUDA_ERROR_UNKNOWN, and the driver still works. */
    CUresult (*selftest)(void) = get("vramsimSelfTestPanic", V, 0);
    EXPECT_EQ(selftest(), 999);
    EXPECT_EQ(free_mem(), f);
    const char *name = NULL;
    OK(cuGetErrorName(2, &name));
    EXPECT(strcmp(name, "CUDA_ERROR_OUT_OF_MEMORY") == 0);
    EXPECT_EQ(cuGetErrorName(12345, &name), 1);
    /* Host memory is not charged. */
    void *h;
    CUresult (*cuMemAllocHost)(void **, size_t) = get("cuMemAllocHost", V, 0);
    CUresult (*cuMemFreeHost)(void *) = get("cuMemFreeHost", V, 0);
    OK(cuMemAllocHost(&h, 64 * MiB));
    memset(h, 1, 64 * MiB);
    EXPECT_EQ(free_mem(), f);
    OK(cuMemFreeHost(h));
    EXPECT_EQ(cuMemFreeHost(h), 1);
    /* Device 1 is a separate device: its context and memory do not show on device 0. */
    CUcontext c0, c1, popped;
    CUresult (*cuCtxGetDevice)(int *) = get("cuCtxGetDevice", V, 0);
    CUresult (*cuCtxCreate)(CUcontext *, unsigned, int) = get("cuCtxCreate", 3020, 0);
    CUresult (*cuCtxDestroy)(CUcontext) = get("cuCtxDestroy", V, 0);
    CUresult (*cuCtxPopCurrent)(CUcontext *) = get("cuCtxPopCurrent", V, 0);
    OK(cuCtxGetCurrent(&c0));
    OK(cuDevicePrimaryCtxRetain(&c1, 1));
    OK(cuCtxSetCurrent(c1));
    OK(cuCtxGetDevice(&d));
    EXPECT_EQ(d, 1);
    OK(cuMemAlloc(&p, 4 * MiB));
    u64 used1;
    OK(vramsimDeviceUsed(1, &used1));
    EXPECT_EQ(used1, 304 * MiB);
    OK(vramsimDeviceUsed(0, &used0));
    EXPECT_EQ(used0, 300 * MiB);
    EXPECT_EQ(free_mem(), 1024 * MiB - 304 * MiB);
    /* A created context on a device that already has one charges no second overhead. */
    CUcontext c2;
    OK(cuCtxCreate(&c2, 0, 1));
    OK(vramsimDeviceUsed(1, &used1));
    EXPECT_EQ(used1, 304 * MiB);
    OK(cuCtxPopCurrent(&popped));
    EXPECT(popped == c2);
    OK(cuCtxDestroy(c2));
    EXPECT_EQ(cuCtxDestroy(c2), 201);
    OK(cuMemFree(p));
    OK(cuCtxSetCurrent(c0));
    return 0;
}

/* cuGetProcAddress_v2 version/flag selection; addresses equal the exported symbols. */
static int procaddr(void) {
    void *f;
    int st;
#define SAME(name, ver, flags, sym)                                                            \
    do {                                                                                       \
        f = NULL;                                                                              \
        st = -1;                                                                               \
        OK(gpa(name, &f, ver, flags, &st));                                                    \
        EXPECT_EQ(st, 0);                                                                      \
        EXPECT(f != NULL && f == dlsym(lib, sym));                                             \
    } while (0)
    SAME("cuMemAlloc", 3020, 0, "cuMemAlloc_v2");
    SAME("cuMemAlloc", 12000, 0, "cuMemAlloc_v2");
    SAME("cuMemFree", 12000, 0, "cuMemFree_v2");
    SAME("cuMemGetInfo", 2000, 0, "cuMemGetInfo");
    SAME("cuMemGetInfo", 3020, 0, "cuMemGetInfo_v2");
    SAME("cuCtxCreate", 3020, 0, "cuCtxCreate_v2");
    SAME("cuCtxCreate", 12000, 0, "cuCtxCreate_v3");
    SAME("cuCtxCreate", 13000, 0, "cuCtxCreate_v4");
    SAME("cuStreamGetCaptureInfo", 12000, 0, "cuStreamGetCaptureInfo_v2");
    SAME("cuStreamGetCaptureInfo", 12030, 2, "cuStreamGetCaptureInfo_v3_ptsz");
    SAME("cuMemAllocAsync", 11020, 0, "cuMemAllocAsync");
    SAME("cuMemAllocAsync", 11020, 1, "cuMemAllocAsync");
    SAME("cuMemAllocAsync", 11020, 2, "cuMemAllocAsync_ptsz");
    SAME("cuMemFreeAsync", 12000, 2, "cuMemFreeAsync_ptsz");
    SAME("cuMemAllocFromPoolAsync", 12000, 2, "cuMemAllocFromPoolAsync_ptsz");
    SAME("cuMemcpyAsync", 12000, 2, "cuMemcpyAsync_ptsz");
    SAME("cuMemcpyHtoD", 12000, 2, "cuMemcpyHtoD_v2_ptds");
    SAME("cuStreamSynchronize", 12000, 2, "cuStreamSynchronize_ptsz");
    SAME("cuMemAlloc", 12000, 2, "cuMemAlloc_v2"); /* no _ptsz variant */
    SAME("cuGetProcAddress", 11030, 0, "cuGetProcAddress");
    SAME("cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2");
    SAME("cuMemCreate", 12000, 0, "cuMemCreate");
    SAME("cuStreamWriteValue32", 12000, 2, "cuStreamWriteValue32_v2_ptsz");
    SAME("cuStreamWriteValue32", 11000, 0, "cuStreamWriteValue32");
    SAME("vramsimLaunchFill", 12000, 0, "vramsimLaunchFill");
    /* Not found: success, NULL, SYMBOL_NOT_FOUND. */
    f = (void *)1;
    OK(gpa("cuNoSuchFunction", &f, 12000, 0, &st));
    EXPECT(f == NULL);
    EXPECT_EQ(st, 1);
    OK(gpa("", &f, 0, 0, &st)); /* the runtime's probe */
    EXPECT_EQ(st, 1);
    /* Too old for any variant: VERSION_NOT_SUFFICIENT. */
    f = (void *)1;
    OK(gpa("cuMemAllocAsync", &f, 11000, 0, &st));
    EXPECT(f == NULL);
    EXPECT_EQ(st, 2);
    /* Newer than the driver: invalid value. */
    EXPECT_EQ(gpa("cuMemAlloc", &f, 13010, 0, &st), 1);
    EXPECT_EQ(gpa(NULL, &f, 12000, 0, &st), 1);
    EXPECT_EQ(gpa("cuMemAlloc", NULL, 12000, 0, &st), 1);
    /* symbolStatus is optional. */
    OK(gpa("cuMemAlloc", &f, 12000, 0, NULL));
    /* The 4-argument 11.x ABI. */
    CUresult (*gpa1)(const char *, void **, int, u64) = dlsym(lib, "cuGetProcAddress");
    OK(gpa1("cuMemAlloc", &f, 11030, 0));
    EXPECT(f == dlsym(lib, "cuMemAlloc_v2"));
    EXPECT_EQ(gpa1("cuNoSuchFunction", &f, 11030, 0), 500);
    return 0;
}

/* Capacity refusal and the device's high-water mark. VRAMSIM_MEMORY=64MiB, no overhead. */
static int capacity(void) {
    start();
    CUdeviceptr a, b, c;
    OK(cuMemAlloc(&a, 40 * MiB));
    EXPECT_EQ(cuMemAlloc(&b, 30 * MiB), 2);
    OK(cuMemAlloc(&b, 24 * MiB));
    EXPECT_EQ(free_mem(), 0);
    EXPECT_EQ(cuMemAlloc(&c, 1), 2);
    OK(cuMemFree(b));
    OK(cuMemAlloc(&c, 1));
    u64 used, high;
    OK(vramsimDeviceUsed(0, &used));
    OK(vramsimDeviceHighWater(0, &high));
    EXPECT_EQ(used, 42 * MiB);
    EXPECT_EQ(high, 64 * MiB);
    Stats s;
    CUresult (*stats)(const char *, int, Stats *) = get("vramsimDeviceStats", V, 0);
    OK(stats(NULL, 0, &s));
    EXPECT_EQ(s.capacity, 64 * MiB);
    EXPECT_EQ(s.used_by_self, 42 * MiB);
    EXPECT_EQ(s.refusals, 2);
    EXPECT_EQ(stats(NULL, 3, &s), 101);
    return 0;
}

static CUresult (*cuMemAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, u64);
static CUresult (*cuMemCreate)(u64 *, size_t, const CUmemAllocationProp *, u64);
static CUresult (*cuMemMap)(CUdeviceptr, size_t, size_t, u64, u64);
static CUresult (*cuMemUnmap)(CUdeviceptr, size_t);
static CUresult (*cuMemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
static CUresult (*cuMemRelease)(u64);

static void vmm_load(void) {
    cuMemAddressReserve = get("cuMemAddressReserve", V, 0);
    cuMemCreate = get("cuMemCreate", V, 0);
    cuMemMap = get("cuMemMap", V, 0);
    cuMemUnmap = get("cuMemUnmap", V, 0);
    cuMemSetAccess = get("cuMemSetAccess", V, 0);
    cuMemRelease = get("cuMemRelease", V, 0);
}

static CUmemAllocationProp dev_prop(void) {
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = 1;                 /* PINNED */
    p.location.type = 1;        /* DEVICE */
    p.location.id = 0;
    p.requestedHandleTypes = 1; /* POSIX fd */
    return p;
}

static void rw(CUdeviceptr va, size_t size) {
    CUmemAccessDesc d = {{1, 0}, 3};
    OK(cuMemSetAccess(va, size, &d, 1));
}

/* One physical handle mapped at two addresses shows the same bytes. */
static int vmm_alias(void) {
    start();
    vmm_load();
    CUresult (*gran)(size_t *, const CUmemAllocationProp *, int) = get("cuMemGetAllocationGranularity", V, 0);
    CUresult (*cuMemAddressFree)(CUdeviceptr, size_t) = get("cuMemAddressFree", V, 0);
    CUresult (*retain)(u64 *, void *) = get("cuMemRetainAllocationHandle", V, 0);
    CUresult (*exp)(void *, u64, int, u64) = get("cuMemExportToShareableHandle", V, 0);
    CUresult (*imp)(u64 *, void *, int) = get("cuMemImportFromShareableHandle", V, 0);
    CUresult (*props)(CUmemAllocationProp *, u64) = get("cuMemGetAllocationPropertiesFromHandle", V, 0);
    CUmemAllocationProp prop = dev_prop();
    size_t g = 0;
    OK(gran(&g, &prop, 0));
    EXPECT_EQ(g, 2 * MiB);
    size_t f0 = free_mem();
    CUdeviceptr va;
    OK(cuMemAddressReserve(&va, 8 * MiB, 0, 0, 0));
    EXPECT(va % (2 * MiB) == 0);
    EXPECT_EQ(free_mem(), f0); /* address space is free */
    u64 h;
    EXPECT_EQ(cuMemCreate(&h, MiB, &prop, 0), 1); /* not a granularity multiple */
    OK(cuMemCreate(&h, 2 * MiB, &prop, 0));
    EXPECT_EQ(free_mem(), f0 - 2 * MiB);
    OK(cuMemMap(va, 2 * MiB, 0, h, 0));
    OK(cuMemMap(va + 4 * MiB, 2 * MiB, 0, h, 0));
    EXPECT_EQ(cuMemMap(va, 2 * MiB, 0, h, 0), 1); /* already mapped */
    rw(va, 2 * MiB);
    rw(va + 4 * MiB, 2 * MiB);
    char *a = (char *)va, *b = (char *)(va + 4 * MiB);
    strcpy(a + 12345, "aliased");
    EXPECT(strcmp(b + 12345, "aliased") == 0);
    b[99] = 42;
    EXPECT_EQ(a[99], 42);
    /* Copies work on mapped memory. */
    char back[8];
    OK(cuMemcpyDtoH(back, va + 12345, 8));
    EXPECT(strcmp(back, "aliased") == 0);
    /* Retain + properties. */
    u64 h2;
    OK(retain(&h2, (void *)(va + 100)));
    EXPECT_EQ(h2, h);
    CUmemAllocationProp got;
    OK(props(&got, h));
    EXPECT_EQ(got.location.type, 1);
    EXPECT_EQ(got.type, 1);
    OK(cuMemRelease(h2));
    /* Export/import: a third mapping of the same bytes. */
    int fd = -1;
    OK(exp(&fd, h, 1, 0));
    EXPECT(fd >= 0);
    u64 hi;
    OK(imp(&hi, (void *)(intptr_t)fd, 1));
    close(fd);
    OK(cuMemMap(va + 2 * MiB, 2 * MiB, 0, hi, 0));
    rw(va + 2 * MiB, 2 * MiB);
    EXPECT(strcmp((char *)(va + 2 * MiB) + 12345, "aliased") == 0);
    EXPECT_EQ(free_mem(), f0 - 2 * MiB); /* importing charges nothing more */
    OK(cuMemUnmap(va + 2 * MiB, 2 * MiB));
    OK(cuMemRelease(hi));
    /* Released while mapped: memory stays until unmapped everywhere. */
    OK(cuMemRelease(h));
    EXPECT_EQ(cuMemRelease(h), 1);
    EXPECT_EQ(free_mem(), f0 - 2 * MiB);
    EXPECT_EQ(a[99], 42);
    OK(cuMemUnmap(va, 2 * MiB));
    EXPECT_EQ(free_mem(), f0 - 2 * MiB);
    EXPECT_EQ(cuMemAddressFree(va, 8 * MiB), 1); /* still mapped at va+4MiB */
    OK(cuMemUnmap(va + 4 * MiB, 2 * MiB));
    EXPECT_EQ(free_mem(), f0);
    OK(cuMemAddressFree(va, 8 * MiB));
    /* At a non-zero offset into a handle: refused with CUDA_ERROR_NOT_SUPPORTED (801), as a
     * real driver answers (cuMemMap's offset "currently must be zero"). */
    OK(cuMemAddressReserve(&va, 2 * MiB, 0, 0, 0));
    OK(cuMemCreate(&h, 4 * MiB, &prop, 0));
    EXPECT_EQ(cuMemMap(va, 2 * MiB, 2 * MiB, h, 0), 801);
    OK(cuMemRelease(h));
    OK(cuMemAddressFree(va, 2 * MiB));
    EXPECT_EQ(free_mem(), f0);
    /* Host location: not charged to the device. */
    CUmemAllocationProp hp = dev_prop();
    hp.location.type = 2; /* HOST */
    OK(cuMemCreate(&h, 4 * MiB, &hp, 0));
    EXPECT_EQ(free_mem(), f0);
    OK(cuMemRelease(h));
    return 0;
}

/* An access to an unmapped range faults: this process must die with SIGSEGV. */
static int vmm_fault(void) {
    start();
    vmm_load();
    CUmemAllocationProp prop = dev_prop();
    CUdeviceptr va;
    u64 h;
    OK(cuMemAddressReserve(&va, 4 * MiB, 0, 0, 0));
    OK(cuMemCreate(&h, 2 * MiB, &prop, 0));
    OK(cuMemMap(va, 2 * MiB, 0, h, 0));
    rw(va, 2 * MiB);
    volatile char *p = (volatile char *)va;
    p[10] = 1;
    OK(cuMemUnmap(va, 2 * MiB));
    printf("touching\n");
    fflush(stdout);
    p[10] = 2;
    printf("survived\n");
    return 0;
}

/* A mapped range without cuMemSetAccess faults too. */
static int vmm_noaccess(void) {
    start();
    vmm_load();
    CUmemAllocationProp prop = dev_prop();
    CUdeviceptr va;
    u64 h;
    OK(cuMemAddressReserve(&va, 2 * MiB, 0, 0, 0));
    OK(cuMemCreate(&h, 2 * MiB, &prop, 0));
    OK(cuMemMap(va, 2 * MiB, 0, h, 0));
    printf("touching\n");
    fflush(stdout);
    ((volatile char *)va)[0] = 1;
    printf("survived\n");
    return 0;
}

static volatile int gate = 0;
static void wait_gate(void *arg) {
    (void)arg;
    while (!__atomic_load_n(&gate, __ATOMIC_ACQUIRE)) usleep(1000);
}

/* Streams run asynchronously; events complete when the stream reaches them. */
static int async(void) {
    start();
    CUresult (*cuStreamCreate)(CUstream *, unsigned) = get("cuStreamCreate", V, 0);
    CUresult (*cuStreamSynchronize)(CUstream) = get("cuStreamSynchronize", V, 0);
    CUresult (*cuStreamQuery)(CUstream) = get("cuStreamQuery", V, 0);
    CUresult (*cuStreamDestroy)(CUstream) = get("cuStreamDestroy", V, 0);
    CUresult (*cuEventCreate)(CUevent *, unsigned) = get("cuEventCreate", V, 0);
    CUresult (*cuEventRecord)(CUevent, CUstream) = get("cuEventRecord", V, 0);
    CUresult (*cuEventQuery)(CUevent) = get("cuEventQuery", V, 0);
    CUresult (*cuEventSynchronize)(CUevent) = get("cuEventSynchronize", V, 0);
    CUresult (*cuEventElapsedTime)(float *, CUevent, CUevent) = get("cuEventElapsedTime", V, 0);
    CUresult (*cuStreamWaitEvent)(CUstream, CUevent, unsigned) = get("cuStreamWaitEvent", V, 0);
    CUresult (*cuLaunchHostFunc)(CUstream, void (*)(void *), void *) = get("cuLaunchHostFunc", V, 0);
    CUresult (*fill)(CUstream, CUdeviceptr, unsigned char, size_t, unsigned) = get("vramsimLaunchFill", V, 0);
    CUresult (*copy)(CUstream, CUdeviceptr, CUdeviceptr, size_t, unsigned) = get("vramsimLaunchCopy", V, 0);
    CUresult (*cuMemcpyAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream) = get("cuMemcpyAsync", V, 0);
    CUresult (*cuMemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream) = get("cuMemsetD8Async", V, 0);

    CUstream s, s2;
    CUevent e0, e1;
    OK(cuStreamCreate(&s, 0));
    OK(cuStreamCreate(&s2, 1 /* non-blocking */));
    OK(cuEventCreate(&e0, 0));
    OK(cuEventCreate(&e1, 0));
    OK(cuEventQuery(e1)); /* never recorded: complete */
    CUdeviceptr buf, buf2;
    OK(cuMemAlloc(&buf, 4096));
    OK(cuMemAlloc(&buf2, 4096));
    /* Gate the stream: recorded event cannot complete before the gate opens. */
    OK(cuEventRecord(e0, s));
    OK(cuLaunchHostFunc(s, wait_gate, NULL));
    OK(fill(s, buf, 0xab, 4096, 1000));
    OK(cuEventRecord(e1, s));
    EXPECT_EQ(cuEventQuery(e1), 600);
    EXPECT_EQ(cuStreamQuery(s), 600);
    /* Work waiting on the event stays behind it too. */
    OK(cuStreamWaitEvent(s2, e1, 0));
    OK(copy(s2, buf2, buf, 4096, 0));
    CUevent e2;
    OK(cuEventCreate(&e2, 0));
    OK(cuEventRecord(e2, s2));
    EXPECT_EQ(cuEventQuery(e2), 600);
    __atomic_store_n(&gate, 1, __ATOMIC_RELEASE);
    OK(cuEventSynchronize(e2));
    OK(cuEventQuery(e1));
    unsigned char back[4096];
    OK(cuMemcpyDtoH(back, buf2, 4096));
    EXPECT_EQ(back[0], 0xab);
    EXPECT_EQ(back[4095], 0xab);
    float ms = -1;
    OK(cuEventElapsedTime(&ms, e0, e1));
    EXPECT(ms >= 0);
    /* A delayed kernel on a blocking stream is seen by a synchronous copy (legacy stream). */
    OK(fill(s, buf, 0x5c, 4096, 50000));
    OK(cuMemcpyDtoH(back, buf, 4096));
    EXPECT_EQ(back[100], 0x5c);
    /* cuMemFree waits for the device: delayed work is done when it returns. */
    OK(cuMemsetD8Async(buf, 0x11, 4096, s));
    OK(fill(s, buf, 0x22, 4096, 50000));
    OK(cuEventRecord(e1, s));
    OK(cuMemFree(buf2));
    OK(cuEventQuery(e1));
    /* Stream memory operations write when the stream gets there. */
    CUresult (*wv32)(CUstream, CUdeviceptr, unsigned, unsigned) = get("cuStreamWriteValue32", V, 0);
    OK(wv32(s, buf, 0xfeedbeef, 0));
    EXPECT_EQ(wv32(s, buf + 1, 1, 0), 1);
    OK(cuStreamSynchronize(s));
    unsigned w = 0;
    OK(cuMemcpyDtoH(&w, buf, 4));
    EXPECT_EQ(w, 0xfeedbeef);
    /* Async copies run in stream order. */
    OK(cuMemAlloc(&buf2, 4096));
    OK(cuMemcpyAsync(buf2, buf, 4096, s));
    OK(cuStreamSynchronize(s));
    OK(cuMemcpyDtoH(back, buf2, 4096));
    EXPECT_EQ(back[7], 0x22);
    /* Pageable host memory: an async HtoD stages its source at the call, an async DtoH
       returns once the data is there. */
    CUresult (*htodA)(CUdeviceptr, const void *, size_t, CUstream) = get("cuMemcpyHtoDAsync", V, 0);
    CUresult (*dtohA)(void *, CUdeviceptr, size_t, CUstream) = get("cuMemcpyDtoHAsync", V, 0);
    unsigned char *src = malloc(4096);
    memset(src, 0x77, 4096);
    OK(fill(s, buf, 0, 4096, 20000));
    OK(htodA(buf, src, 4096, s));
    memset(src, 0x99, 4096); /* reused at once */
    OK(dtohA(back, buf, 4096, s));
    EXPECT_EQ(back[5], 0x77);
    free(src);
    /* Pinned host memory: fully asynchronous. */
    CUresult (*cuMemAllocHost)(void **, size_t) = get("cuMemAllocHost", V, 0);
    unsigned char *pinned;
    OK(cuMemAllocHost((void **)&pinned, 4096));
    pinned[0] = 0;
    __atomic_store_n(&gate, 0, __ATOMIC_RELEASE);
    OK(cuLaunchHostFunc(s, wait_gate, NULL));
    OK(fill(s, buf, 0x31, 4096, 0));
    OK(dtohA(pinned, buf, 4096, s));
    EXPECT_EQ(pinned[0], 0); /* still behind the gate */
    __atomic_store_n(&gate, 1, __ATOMIC_RELEASE);
    OK(cuStreamSynchronize(s));
    EXPECT_EQ(pinned[0], 0x31);
    OK(cuStreamDestroy(s));
    EXPECT_EQ(cuStreamSynchronize(s), 400);
    return 0;
}

/* A delayed stream: an event recorded behind slow work is not complete right after the record,
   and is after a synchronization. Run with VRAMSIM_STREAM_DELAY=1500ms: the margin is seconds. */
static int delay(void) {
    start();
    CUresult (*cuStreamCreate)(CUstream *, unsigned) = get("cuStreamCreate", V, 0);
    CUresult (*cuEventCreate)(CUevent *, unsigned) = get("cuEventCreate", V, 0);
    CUresult (*cuEventRecord)(CUevent, CUstream) = get("cuEventRecord", V, 0);
    CUresult (*cuEventQuery)(CUevent) = get("cuEventQuery", V, 0);
    CUresult (*cuEventSynchronize)(CUevent) = get("cuEventSynchronize", V, 0);
    CUresult (*cuMemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream) = get("cuMemsetD8Async", V, 0);
    CUstream s;
    CUevent e;
    CUdeviceptr p;
    unsigned char b[16];
    OK(cuStreamCreate(&s, 1));
    OK(cuEventCreate(&e, 0));
    OK(cuMemAlloc(&p, 16));
    OK(cuMemsetD8Async(p, 0x42, 16, s));
    OK(cuEventRecord(e, s));
    EXPECT_EQ(cuEventQuery(e), 600);
    OK(cuEventSynchronize(e));
    OK(cuEventQuery(e));
    OK(cuMemcpyDtoH(b, p, 16));
    EXPECT_EQ(b[15], 0x42);
    return 0;
}

/* Stream capture: status tracking and capture-unsafe calls. */
static int capture(void) {
    start();
    CUresult (*cuStreamCreate)(CUstream *, unsigned) = get("cuStreamCreate", V, 0);
    CUresult (*begin)(CUstream, int) = get("cuStreamBeginCapture", V, 0);
    CUresult (*end)(CUstream, void **) = get("cuStreamEndCapture", V, 0);
    CUresult (*is)(CUstream, int *) = get("cuStreamIsCapturing", V, 0);
    CUresult (*xchg)(int *) = get("cuThreadExchangeStreamCaptureMode", V, 0);
    CUresult (*fill)(CUstream, CUdeviceptr, unsigned char, size_t, unsigned) = get("vramsimLaunchFill", V, 0);
    CUstream s;
    void *g = NULL;
    int st = -1;
    CUdeviceptr p;
    OK(cuStreamCreate(&s, 0));
    OK(cuMemAlloc(&p, 64));
    OK(is(s, &st));
    EXPECT_EQ(st, 0);
    OK(begin(s, 0));
    OK(is(s, &st));
    EXPECT_EQ(st, 1);
    OK(fill(s, p, 1, 64, 0)); /* captured, not executed */
    OK(end(s, &g));
    EXPECT(g != NULL);
    unsigned char b[64];
    OK(cuMemcpyDtoH(b, p, 64));
    EXPECT(b[0] != 1 || b[63] != 1);
    /* A free during a global capture invalidates it. */
    OK(begin(s, 0));
    EXPECT_EQ(cuMemFree(p), 900);
    OK(is(s, &st));
    EXPECT_EQ(st, 2);
    EXPECT_EQ(end(s, &g), 901);
    EXPECT(g == NULL);
    /* So does an event query. */
    CUresult (*cuEventCreate)(CUevent *, unsigned) = get("cuEventCreate", V, 0);
    CUresult (*cuEventQuery)(CUevent) = get("cuEventQuery", V, 0);
    CUevent ev;
    OK(cuEventCreate(&ev, 0));
    OK(begin(s, 0));
    EXPECT_EQ(cuEventQuery(ev), 900);
    EXPECT_EQ(end(s, &g), 901);
    /* Relaxed mode on this thread allows it. */
    OK(begin(s, 0));
    int mode = 2;
    OK(xchg(&mode));
    EXPECT_EQ(mode, 0);
    OK(cuMemFree(p));
    OK(xchg(&mode));
    OK(end(s, &g));
    return 0;
}

/* Stream-ordered pools. */
static int pools(void) {
    start();
    CUresult (*allocA)(CUdeviceptr *, size_t, CUstream) = get("cuMemAllocAsync", V, 0);
    CUresult (*freeA)(CUdeviceptr, CUstream) = get("cuMemFreeAsync", V, 0);
    CUresult (*defpool)(CUmemoryPool *, int) = get("cuDeviceGetDefaultMemPool", V, 0);
    CUresult (*setattr)(CUmemoryPool, int, void *) = get("cuMemPoolSetAttribute", V, 0);
    CUresult (*getattr)(CUmemoryPool, int, void *) = get("cuMemPoolGetAttribute", V, 0);
    CUresult (*trim)(CUmemoryPool, size_t) = get("cuMemPoolTrimTo", V, 0);
    CUresult (*sync)(CUstream) = get("cuStreamSynchronize", V, 0);
    CUmemoryPool pool;
    OK(defpool(&pool, 0));
    size_t f0 = free_mem();
    CUdeviceptr p;
    OK(allocA(&p, 4 * MiB, 0));
    EXPECT_EQ(free_mem(), f0 - 4 * MiB);
    OK(freeA(p, 0));
    EXPECT_EQ(freeA(p, 0), 1);
    OK(sync(0));
    EXPECT_EQ(free_mem(), f0); /* threshold 0: released */
    u64 thr = 64 * MiB, v = 0;
    OK(setattr(pool, 4, &thr));
    OK(allocA(&p, 4 * MiB, 0));
    OK(freeA(p, 0));
    OK(sync(0));
    EXPECT_EQ(free_mem(), f0 - 4 * MiB); /* kept by the pool */
    OK(getattr(pool, 5, &v));
    EXPECT_EQ(v, 4 * MiB);
    OK(getattr(pool, 7, &v));
    EXPECT_EQ(v, 0);
    CUdeviceptr q;
    OK(allocA(&q, 4 * MiB, 0));
    EXPECT_EQ(q, p); /* reused */
    OK(cuMemFree(q)); /* cuMemFree accepts pool memory */
    OK(trim(pool, 0));
    EXPECT_EQ(free_mem(), f0);
    /* cuMemFreeAsync of cuMemAlloc memory: freed in stream order. */
    OK(cuMemAlloc(&p, 4 * MiB));
    OK(freeA(p, 0));
    EXPECT_EQ(freeA(p, 0), 1);
    OK(sync(0));
    EXPECT_EQ(free_mem(), f0);
    EXPECT_EQ(cuMemFree(p), 1);
    return 0;
}

/* A memory pool belongs to the device its properties name, not to a context: NVIDIA's runtime
 * (cudaMemPoolCreate, RMM's CudaAsyncMemoryResource) creates one before any context is current.
 * Before cuInit it is refused like every call. */
static int pool_no_context(void) {
    CUresult (*create)(CUmemoryPool *, const void *) = get("cuMemPoolCreate", V, 0);
    CUresult (*destroy)(CUmemoryPool) = get("cuMemPoolDestroy", V, 0);
    CUresult (*allocP)(CUdeviceptr *, size_t, CUmemoryPool, CUstream) =
        get("cuMemAllocFromPoolAsync", V, 0);
    CUresult (*freeA)(CUdeviceptr, CUstream) = get("cuMemFreeAsync", V, 0);
    CUresult (*sync)(CUstream) = get("cuStreamSynchronize", V, 0);
    /* CUmemPoolProps: 88 bytes, allocType pinned (1), location {device (1), ordinal} at 8. */
    struct { int allocType, handleTypes; CUmemLocation location; unsigned char rest[72]; } props;
    memset(&props, 0, sizeof props);
    _Static_assert(sizeof props == 88, "CUmemPoolProps is 88 bytes");
    props.allocType = 1;
    props.location.type = 1;
    CUmemoryPool pool;
    EXPECT_EQ(create(&pool, &props), 3); /* CUDA_ERROR_NOT_INITIALIZED */
    OK(cuInit(0));
    OK(create(&pool, &props));
    props.location.id = 99;
    CUmemoryPool bad;
    EXPECT_EQ(create(&bad, &props), 101); /* CUDA_ERROR_INVALID_DEVICE */
    /* Allocating from it needs a context (the legacy stream is the context's). */
    CUdeviceptr p;
    EXPECT_EQ(allocP(&p, MiB, pool, 0), 201); /* CUDA_ERROR_INVALID_CONTEXT */
    int dev;
    CUcontext ctx;
    OK(cuDeviceGet(&dev, 0));
    OK(cuDevicePrimaryCtxRetain(&ctx, dev));
    OK(cuCtxSetCurrent(ctx));
    OK(allocP(&p, MiB, pool, 0));
    OK(freeA(p, 0));
    OK(sync(0));
    OK(destroy(pool));
    return 0;
}

/* A stream-ordered free on a capturing stream is a free node, which takes only a graph
 * allocation's address: memory of the device's pool allocated before the capture, cuMemAlloc
 * memory and mapped virtual memory are refused with CUDA_ERROR_INVALID_VALUE (1), as a real
 * driver does, and the capture goes on (status 1; a graph allocation and its free are still
 * captured after it, and the end gives a graph); the memory is not freed (its bytes read back,
 * and it is freed after the capture). A graph allocation's free in its capture succeeds. */
static int capture_free(void) {
    start();
    vmm_load();
    CUresult (*cuStreamCreate)(CUstream *, unsigned) = get("cuStreamCreate", V, 0);
    CUresult (*begin)(CUstream, int) = get("cuStreamBeginCapture", V, 0);
    CUresult (*end)(CUstream, void **) = get("cuStreamEndCapture", V, 0);
    CUresult (*is)(CUstream, int *) = get("cuStreamIsCapturing", V, 0);
    CUresult (*allocA)(CUdeviceptr *, size_t, CUstream) = get("cuMemAllocAsync", V, 0);
    CUresult (*freeA)(CUdeviceptr, CUstream) = get("cuMemFreeAsync", V, 0);
    CUresult (*sync)(CUstream) = get("cuStreamSynchronize", V, 0);
    CUresult (*gdestroy)(void *) = get("cuGraphDestroy", V, 0);
    CUstream s;
    OK(cuStreamCreate(&s, 1));
    CUdeviceptr pooled, linear, mapped;
    OK(allocA(&pooled, 4 * MiB, s));
    OK(cuMemAlloc(&linear, 4 * MiB));
    CUmemAllocationProp prop = dev_prop();
    u64 h;
    OK(cuMemAddressReserve(&mapped, 2 * MiB, 0, 0, 0));
    OK(cuMemCreate(&h, 2 * MiB, &prop, 0));
    OK(cuMemMap(mapped, 2 * MiB, 0, h, 0));
    rw(mapped, 2 * MiB);
    OK(sync(s));
    size_t f0 = free_mem();
    CUdeviceptr mem[3] = {pooled, linear, mapped};
    for (int i = 0; i < 3; i++) {
        unsigned char b = 0x40 + i;
        OK(cuMemcpyHtoD(mem[i], &b, 1));
        void *g = NULL;
        int st = -1;
        OK(begin(s, 0));
        EXPECT_EQ(freeA(mem[i], s), 1);
        OK(is(s, &st));
        EXPECT_EQ(st, 1);
        CUdeviceptr q = 0;
        OK(allocA(&q, MiB, s));
        EXPECT_EQ(freeA(mem[i], s), 1);
        OK(freeA(q, s));
        OK(end(s, &g));
        EXPECT(g != NULL);
        OK(gdestroy(g));
        OK(is(s, &st));
        EXPECT_EQ(st, 0);
        OK(sync(s));
        EXPECT_EQ(free_mem(), f0); /* nothing freed */
        unsigned char r = 0;
        OK(cuMemcpyDtoH(&r, mem[i], 1));
        EXPECT_EQ(r, 0x40 + i);
    }
    /* A graph allocation freed in its own capture: a free node. */
    void *g = NULL;
    CUdeviceptr q = 0;
    OK(begin(s, 0));
    OK(allocA(&q, MiB, s));
    OK(freeA(q, s));
    OK(end(s, &g));
    EXPECT(g != NULL);
    OK(gdestroy(g));
    /* After the capture each is freed as usual. */
    OK(freeA(pooled, s));
    OK(freeA(linear, s));
    EXPECT_EQ(freeA(mapped, s), 1); /* never a stream-ordered free's */
    OK(sync(s));
    OK(cuMemUnmap(mapped, 2 * MiB));
    OK(cuMemRelease(h));
    return 0;
}

/* Holds `MiB` of device memory until stdin closes (for the sharing tests). */
static int hold(long mib) {
    start();
    CUdeviceptr p;
    OK(cuMemAlloc(&p, (size_t)mib * MiB));
    printf("ready\n");
    fflush(stdout);
    char c;
    while (read(0, &c, 1) > 0) {}
    return 0;
}

/* Prints free memory; tries to allocate `mib` and prints the result code. */
static int probe(long mib) {
    start();
    printf("free %zu\n", free_mem());
    CUdeviceptr p;
    CUresult r = cuMemAlloc(&p, (size_t)mib * MiB);
    printf("alloc %d\n", r);
    u64 high;
    OK(vramsimDeviceHighWater(0, &high));
    printf("high %llu\n", high);
    return 0;
}

/* Fault injection: VRAMSIM_FAIL=cuMemAlloc:nth=3,cuMemCreate:after=4MiB */
static int inject(void) {
    start();
    vmm_load();
    CUdeviceptr p;
    OK(cuMemAlloc(&p, 10));
    OK(cuMemAlloc(&p, 10));
    EXPECT_EQ(cuMemAlloc(&p, 10), 2);
    OK(cuMemAlloc(&p, 10));
    CUmemAllocationProp prop = dev_prop();
    u64 h;
    OK(cuMemCreate(&h, 2 * MiB, &prop, 0));
    OK(cuMemCreate(&h, 2 * MiB, &prop, 0));
    EXPECT_EQ(cuMemCreate(&h, 2 * MiB, &prop, 0), 2);
    return 0;
}

/* A child forked after cuInit cannot use CUDA; the parent can, and keeps its memory. */
static int fork_child(void) {
    start();
    CUdeviceptr p, q;
    OK(cuMemAlloc(&p, 4 * MiB));
    u64 before, after;
    OK(vramsimDeviceUsed(0, &before));
    pid_t pid = fork();
    if (pid == 0) {
        if (cuMemAlloc(&q, 10) != 3) _exit(10);
        if (cuInit(0) != 3) _exit(11);
        _exit(0);
    }
    int status = 0;
    EXPECT(waitpid(pid, &status, 0) == pid);
    EXPECT(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0);
    OK(vramsimDeviceUsed(0, &after));
    EXPECT_EQ(after, before);
    OK(cuMemFree(p));
    return 0;
}

/* Several threads with their own streams (and the per-thread default stream) allocate, fill,
   copy and free at once; data must come back intact and nothing may deadlock. */
static CUcontext shared_ctx;
static void *worker(void *arg) {
    long id = (long)arg;
    OK(cuCtxSetCurrent(shared_ctx));
    CUresult (*cuStreamCreate)(CUstream *, unsigned) = get("cuStreamCreate", V, 0);
    CUresult (*cuStreamSynchronize)(CUstream) = get("cuStreamSynchronize", V, 0);
    CUresult (*cuStreamDestroy)(CUstream) = get("cuStreamDestroy", V, 0);
    CUresult (*fill)(CUstream, CUdeviceptr, unsigned char, size_t, unsigned) = get("vramsimLaunchFill", V, 0);
    CUresult (*allocA)(CUdeviceptr *, size_t, CUstream) = get("cuMemAllocAsync", V, 2);
    CUresult (*freeA)(CUdeviceptr, CUstream) = get("cuMemFreeAsync", V, 2);
    CUresult (*dtohA)(void *, CUdeviceptr, size_t, CUstream) = get("cuMemcpyDtoHAsync", V, 2);
    CUstream s;
    OK(cuStreamCreate(&s, id % 2));
    unsigned char back[8192];
    for (int i = 0; i < 200; i++) {
        size_t n = 512 + (size_t)((i * 977 + id * 131) % 7680);
        unsigned char v = (unsigned char)(id * 16 + i);
        CUdeviceptr p;
        if (i % 2) {
            OK(cuMemAlloc(&p, n));
            OK(fill(s, p, v, n, i % 7 == 0 ? 100 : 0));
            OK(cuStreamSynchronize(s));
            OK(cuMemcpyDtoH(back, p, n));
            OK(cuMemFree(p));
        } else {
            OK(allocA(&p, n, 0)); /* per-thread default stream */
            OK(fill((CUstream)2, p, v, n, 0));
            OK(dtohA(back, p, n, 0));
            OK(freeA(p, 0));
        }
        EXPECT_EQ(back[0], v);
        EXPECT_EQ(back[n - 1], v);
        size_t f, t;
        OK(cuMemGetInfo(&f, &t));
    }
    OK(cuStreamDestroy(s));
    return NULL;
}

static int threads(void) {
    start();
    CUresult (*cuCtxGetCurrent)(CUcontext *) = get("cuCtxGetCurrent", V, 0);
    OK(cuCtxGetCurrent(&shared_ctx));
    size_t f0 = free_mem();
    pthread_t t[6];
    for (long i = 0; i < 6; i++) EXPECT(pthread_create(&t[i], NULL, worker, (void *)i) == 0);
    for (int i = 0; i < 6; i++) pthread_join(t[i], NULL);
    CUresult (*cuCtxSynchronize)(void) = get("cuCtxSynchronize", V, 0);
    OK(cuCtxSynchronize());
    EXPECT_EQ(free_mem(), f0);
    return 0;
}

/* Prints total memory (for the bad-configuration test). */
static int total(void) {
    start();
    size_t f, t;
    OK(cuMemGetInfo(&f, &t));
    printf("total %zu\n", t);
    return 0;
}

/* CUDA_VISIBLE_DEVICES: prints what the process sees (count, then per ordinal its PCI bus id
 * and the first UUID byte), allocates `mib` MiB on ordinal 0 and prints what every physical
 * device's accounting holds while it is live. cuInit's code is printed when it fails. */
static int visible(long mib) {
    CUresult rc = cuInit(0);
    if (rc != 0) {
        printf("cuInit %d\n", rc);
        return 0;
    }
    CUresult (*cuDeviceGetCount)(int *) = get("cuDeviceGetCount", V, 0);
    CUresult (*cuDeviceGetPCIBusId)(char *, int, int) = get("cuDeviceGetPCIBusId", V, 0);
    CUresult (*cuDeviceGetUuid)(unsigned char *, int) = get("cuDeviceGetUuid", V, 0);
    CUresult (*cuDeviceGetName)(char *, int, int) = get("cuDeviceGetName", V, 0);
    CUresult (*stats)(const char *, int, Stats *) = get("vramsimDeviceStats", V, 0);
    int n;
    OK(cuDeviceGetCount(&n));
    printf("count %d\n", n);
    for (int d = 0; d < n; d++) {
        char bus[32], name[64];
        unsigned char uuid[16];
        OK(cuDeviceGetPCIBusId(bus, sizeof bus, d));
        OK(cuDeviceGetUuid(uuid, d));
        OK(cuDeviceGetName(name, sizeof name, d));
        printf("ordinal %d bus %s uuid0 %02x name %s\n", d, bus, uuid[0], name);
    }
    EXPECT_EQ(cuDeviceGetPCIBusId((char[32]){0}, 32, n), 101);
    start();
    CUdeviceptr p;
    OK(cuMemAlloc(&p, (size_t)mib * MiB));
    for (int phys = 0;; phys++) {
        Stats st;
        if (stats(NULL, phys, &st) != 0) break;
        printf("physical %d used_by_self_mib %llu\n", phys, st.used_by_self / MiB);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    load();
    const char *s = argv[1];
    long arg = argc > 2 ? atol(argv[2]) : 0;
    if (!strcmp(s, "basic")) return basic();
    if (!strcmp(s, "procaddr")) return procaddr();
    if (!strcmp(s, "capacity")) return capacity();
    if (!strcmp(s, "vmm_alias")) return vmm_alias();
    if (!strcmp(s, "vmm_fault")) return vmm_fault();
    if (!strcmp(s, "vmm_noaccess")) return vmm_noaccess();
    if (!strcmp(s, "async")) return async();
    if (!strcmp(s, "capture")) return capture();
    if (!strcmp(s, "capture_free")) return capture_free();
    if (!strcmp(s, "pools")) return pools();
    if (!strcmp(s, "pool_no_context")) return pool_no_context();
    if (!strcmp(s, "hold")) return hold(arg);
    if (!strcmp(s, "probe")) return probe(arg);
    if (!strcmp(s, "inject")) return inject();
    if (!strcmp(s, "total")) return total();
    if (!strcmp(s, "fork")) return fork_child();
    if (!strcmp(s, "threads")) return threads();
    if (!strcmp(s, "delay")) return delay();
    if (!strcmp(s, "visible")) return visible(arg);
    fprintf(stderr, "unknown scenario %s\n", s);
    return 2;
}
