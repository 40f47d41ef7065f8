/* modcheck: the simulated driver's module/library/kernel API, private export tables and
 * modelled kernel time, one scenario per run (tests/modules.rs):
 *   modcheck modules CUBIN   globals, kernels, attributes, occupancy, unload of a cubin file
 *   modcheck tables          context-local storage (and its destructors), context and stream ids
 *   modcheck kernel-time N   N launches on a stream; prints whether it was busy after them
 *   modcheck contextless CUBIN
 *                            a library loaded with no context current (on the main thread
 *                            before any context, and on a second thread while the main one
 *                            has one, as NVIDIA's runtime loads a kernel library on PyTorch's
 *                            autograd thread): loading and its kernels need no context, the
 *                            per-context calls (globals, functions) answer 201 without one
 * Prints what it checks; exit 0 when every check passed, 1 with a line naming the first
 * failure. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream;
typedef unsigned long long CUdeviceptr;
typedef struct { unsigned char bytes[16]; } CUuuid;
typedef struct {
    unsigned gx, gy, gz, bx, by, bz, smem;
    CUstream stream;
    void *attrs;
    unsigned nattrs;
} CUlaunchConfig;

extern CUresult cuInit(unsigned);
extern CUresult cuDevicePrimaryCtxRetain(CUcontext *, int);
extern CUresult cuDevicePrimaryCtxRelease_v2(int);
extern CUresult cuCtxSetCurrent(CUcontext);
extern CUresult cuCtxGetId(CUcontext, unsigned long long *);
extern CUresult cuMemGetInfo_v2(size_t *, size_t *);
extern CUresult cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
extern CUresult cuModuleLoad(CUmodule *, const char *);
extern CUresult cuModuleLoadData(CUmodule *, const void *);
extern CUresult cuCtxGetCurrent(CUcontext *);
extern CUresult cuModuleUnload(CUmodule);
extern CUresult cuModuleGetGlobal_v2(CUdeviceptr *, size_t *, CUmodule, const char *);
extern CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
extern CUresult cuLibraryLoadData(CUmodule *, const void *, void *, void *, unsigned, void *, void *, unsigned);
extern CUresult cuLibraryUnload(CUmodule);
extern CUresult cuLibraryGetGlobal(CUdeviceptr *, size_t *, CUmodule, const char *);
extern CUresult cuLibraryGetKernel(CUfunction *, CUmodule, const char *);
extern CUresult cuLibraryGetKernelCount(unsigned *, CUmodule);
extern CUresult cuLibraryGetModule(CUmodule *, CUmodule);
extern CUresult cuKernelGetFunction(CUfunction *, CUfunction);
extern CUresult cuKernelGetLibrary(CUmodule *, CUfunction);
extern CUresult cuKernelSetAttribute(int, int, CUfunction, int);
extern CUresult cuKernelGetAttribute(int *, int, CUfunction, int);
extern CUresult cuFuncGetAttribute(int *, int, CUfunction);
extern CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *, CUfunction, int, size_t);
extern CUresult cuOccupancyAvailableDynamicSMemPerBlock(size_t *, CUfunction, int, int);
extern CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **);
extern CUresult cuLaunchKernelEx(const CUlaunchConfig *, CUfunction, void **, void **);
extern CUresult cuStreamCreate(CUstream *, unsigned);
extern CUresult cuStreamQuery(CUstream);
extern CUresult cuStreamSynchronize(CUstream);
extern CUresult cuStreamGetId(CUstream, unsigned long long *);
extern CUresult cuGraphGetNodes(void);
extern CUresult cuLinkCreate_v2(void);
extern CUresult cuGetExportTable(const void **, const CUuuid *);

#define EXPECT_RC(call, want)                                                                 \
    do {                                                                                      \
        CUresult r_ = (call);                                                                 \
        if (r_ != (want)) {                                                                   \
            printf("FAIL %s -> %d, want %d (line %d)\n", #call, r_, (want), __LINE__);         \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)
#define OK(call) EXPECT_RC(call, 0)
#define EXPECT(cond)                                                                          \
    do {                                                                                      \
        if (!(cond)) {                                                                        \
            printf("FAIL %s (line %d)\n", #cond, __LINE__);                                   \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

static CUuuid uuid(const char *hex) {
    CUuuid u;
    for (int i = 0, j = 0; i < 16; j++) {
        if (hex[j] == '-') continue;
        unsigned b;
        sscanf(hex + j, "%2x", &b);
        u.bytes[i++] = (unsigned char)b;
        j++;
    }
    return u;
}

static const void **table(const char *hex) {
    const void *t = 0;
    CUuuid u = uuid(hex);
    OK(cuGetExportTable(&t, &u));
    return (const void **)t;
}

static size_t free_now(void) {
    size_t f, t;
    OK(cuMemGetInfo_v2(&f, &t));
    return f;
}

static int modules(const char *path) {
    CUcontext ctx;
    OK(cuDevicePrimaryCtxRetain(&ctx, 0));
    OK(cuCtxSetCurrent(ctx));
    /* cuModuleLoad: globals sized and initialised from the cubin, allocated on the device. */
    CUmodule m;
    OK(cuModuleLoad(&m, path));
    size_t before = free_now();
    CUdeviceptr p;
    size_t n = 0;
    OK(cuModuleGetGlobal_v2(&p, &n, m, "weights"));
    EXPECT(n == 8);
    unsigned char got[8];
    OK(cuMemcpyDtoH_v2(got, p, 8));
    for (int i = 0; i < 8; i++) EXPECT(got[i] == i + 1);
    CUdeviceptr p2;
    OK(cuModuleGetGlobal_v2(&p2, &n, m, "weights"));
    EXPECT(p2 == p);
    OK(cuModuleGetGlobal_v2(&p2, &n, m, "counter"));
    EXPECT(n == 4);
    unsigned zero = 1;
    OK(cuMemcpyDtoH_v2(&zero, p2, 4));
    EXPECT(zero == 0);
    EXPECT(free_now() < before);
    EXPECT_RC(cuModuleGetGlobal_v2(&p2, &n, m, "nothing"), 500);
    printf("module globals: weights 8 bytes initialised, counter 4 bytes zeroed\n");

    /* Functions: plausible attributes, settable ones kept, others refused. */
    CUfunction f, f2;
    OK(cuModuleGetFunction(&f, m, "kern"));
    OK(cuModuleGetFunction(&f2, m, "kern"));
    EXPECT(f == f2);
    int v;
    OK(cuFuncGetAttribute(&v, 0, f));
    EXPECT(v == 1024);
    OK(cuFuncGetAttribute(&v, 4, f));
    EXPECT(v > 0);
    OK(cuFuncGetAttribute(&v, 8, f));
    EXPECT(v == 49152);
    EXPECT_RC(cuFuncGetAttribute(&v, 99, f), 1);
    int blocks;
    OK(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, f, 256, 0));
    EXPECT(blocks == 8);
    OK(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, f, 1024, 100000));
    EXPECT(blocks == 2);
    size_t smem;
    OK(cuOccupancyAvailableDynamicSMemPerBlock(&smem, f, 2, 256));
    EXPECT(smem == 233472 / 2 - 1024);
    printf("function attributes and occupancy: ok\n");

    /* Unload gives the globals' memory back; the handles die with it. */
    OK(cuModuleUnload(m));
    EXPECT(free_now() == before);
    EXPECT_RC(cuModuleGetGlobal_v2(&p2, &n, m, "weights"), 400);
    EXPECT_RC(cuFuncGetAttribute(&v, 0, f), 400);
    printf("unload: memory back, handles invalid\n");

    /* The library API on the same image, from memory. */
    FILE *fp = fopen(path, "rb");
    EXPECT(fp);
    static unsigned char image[1 << 16];
    size_t len = fread(image, 1, sizeof image, fp);
    fclose(fp);
    EXPECT(len > 64);
    CUmodule lib, back;
    OK(cuLibraryLoadData(&lib, image, 0, 0, 0, 0, 0, 0));
    unsigned count;
    OK(cuLibraryGetKernelCount(&count, lib));
    EXPECT(count == 1);
    CUfunction k, kf;
    OK(cuLibraryGetKernel(&k, lib, "kern"));
    OK(cuKernelGetFunction(&kf, k));
    OK(cuKernelGetLibrary(&back, k));
    EXPECT(back == lib);
    OK(cuKernelSetAttribute(8, 100000, k, 0));
    OK(cuKernelGetAttribute(&v, 8, k, 0));
    EXPECT(v == 100000);
    OK(cuFuncGetAttribute(&v, 8, kf));
    EXPECT(v == 100000);
    EXPECT_RC(cuKernelSetAttribute(8, 1 << 20, k, 0), 1);
    EXPECT_RC(cuKernelSetAttribute(0, 512, k, 0), 1);
    OK(cuLibraryGetGlobal(&p, &n, lib, "weights"));
    EXPECT(n == 8);
    OK(cuLibraryUnload(lib));
    printf("library: kernels, attributes, globals: ok\n");

    /* Families answered "not supported". */
    EXPECT_RC(cuGraphGetNodes(), 801);
    EXPECT_RC(cuLinkCreate_v2(), 801);
    printf("modules: ok\n");
    return 0;
}

static int dtor_calls;
static void dtor(CUcontext c, void *key, void *value) {
    (void)c;
    if (key == (void *)0x10 && value == (void *)0x20) dtor_calls++;
}

static int tables(void) {
    CUcontext ctx;
    OK(cuDevicePrimaryCtxRetain(&ctx, 0));
    OK(cuCtxSetCurrent(ctx));
    /* Context-local storage: put, get, delete; a missing key is 400. */
    const void **cls = table("c693336e-1121-df11-a8c3-68f355d89593");
    CUresult (*put)(CUcontext, void *, void *, void (*)(CUcontext, void *, void *)) = cls[0];
    CUresult (*del)(CUcontext, void *) = cls[1];
    CUresult (*get)(void **, CUcontext, void *) = cls[2];
    void *v = 0;
    EXPECT_RC(get(&v, ctx, (void *)0x10), 400);
    OK(put(0, (void *)0x10, (void *)0x20, dtor));
    OK(get(&v, ctx, (void *)0x10));
    EXPECT(v == (void *)0x20);
    OK(put(ctx, (void *)0x11, (void *)0x21, 0));
    OK(del(ctx, (void *)0x11));
    EXPECT_RC(get(&v, 0, (void *)0x11), 400);
    /* Context and stream ids, as cuCtxGetId and cuStreamGetId give them. */
    const void **ids = table("21318c60-9714-3248-8ca6-41ff7324c8f2");
    CUresult (*ctx_id)(CUcontext, unsigned long long *) = ids[4];
    CUresult (*stream_of)(CUcontext, CUstream, CUstream *) = ids[51];
    CUresult (*stream_id)(CUcontext, CUstream, unsigned long long *) = ids[39];
    unsigned long long a, b;
    OK(ctx_id(ctx, &a));
    OK(cuCtxGetId(ctx, &b));
    EXPECT(a == b);
    CUstream s, got;
    OK(cuStreamCreate(&s, 0));
    OK(stream_of(ctx, s, &got));
    EXPECT(got == s);
    OK(stream_id(ctx, got, &a));
    OK(cuStreamGetId(s, &b));
    EXPECT(a == b);
    EXPECT_RC(stream_id(ctx, (CUstream)0x1234, &a), 400);
    /* The destructor runs once when the context goes away. */
    EXPECT(dtor_calls == 0);
    OK(cuDevicePrimaryCtxRelease_v2(0));
    EXPECT(dtor_calls == 1);
    printf("tables: ok\n");
    return 0;
}

static int kernel_time(int n) {
    CUcontext ctx;
    OK(cuDevicePrimaryCtxRetain(&ctx, 0));
    OK(cuCtxSetCurrent(ctx));
    CUstream s;
    OK(cuStreamCreate(&s, 0));
    CUlaunchConfig c = {1, 1, 1, 32, 1, 1, 0, s, 0, 0};
    for (int i = 0; i < n; i++) {
        if (i % 2) OK(cuLaunchKernel(0, 1, 1, 1, 32, 1, 1, 0, s, 0, 0));
        else OK(cuLaunchKernelEx(&c, 0, 0, 0));
    }
    CUresult q = cuStreamQuery(s);
    OK(cuStreamSynchronize(s));
    printf("busy after launches: %d\n", q == 600);
    return 0;
}

/* The image of the cubin file at `path` (static storage, read once). */
static const unsigned char *read_image(const char *path) {
    static unsigned char image[1 << 16];
    FILE *fp = fopen(path, "rb");
    EXPECT(fp);
    size_t len = fread(image, 1, sizeof image, fp);
    fclose(fp);
    EXPECT(len > 64);
    return image;
}

/* A library is context-independent (CUDA 12's cuLibrary*): loading it and naming its kernels
 * need no current context; a global's address and a kernel's function are per context, so
 * those answer CUDA_ERROR_INVALID_CONTEXT (201) without one. Returns the library. */
static CUmodule load_without_context(const unsigned char *image) {
    CUcontext cur = (CUcontext)1;
    OK(cuCtxGetCurrent(&cur));
    EXPECT(cur == 0);
    CUmodule lib = 0, m = 0, back = 0;
    OK(cuLibraryLoadData(&lib, image, 0, 0, 0, 0, 0, 0));
    EXPECT(lib != 0);
    unsigned count;
    OK(cuLibraryGetKernelCount(&count, lib));
    EXPECT(count == 1);
    CUfunction k = 0, f;
    OK(cuLibraryGetKernel(&k, lib, "kern"));
    OK(cuKernelGetLibrary(&back, k));
    EXPECT(back == lib);
    CUdeviceptr p;
    size_t n;
    EXPECT_RC(cuLibraryGetGlobal(&p, &n, lib, "weights"), 201);
    EXPECT_RC(cuKernelGetFunction(&f, k), 201);
    EXPECT_RC(cuLibraryGetModule(&back, lib), 201);
    /* A module, unlike a library, is loaded into the current context. */
    EXPECT_RC(cuModuleLoadData(&m, image), 201);
    return lib;
}

/* With the context current, the library loaded without one works as any other. */
static void use_with_context(CUmodule lib) {
    CUfunction k, f;
    OK(cuLibraryGetKernel(&k, lib, "kern"));
    OK(cuKernelGetFunction(&f, k));
    CUdeviceptr p;
    size_t n = 0;
    OK(cuLibraryGetGlobal(&p, &n, lib, "weights"));
    EXPECT(n == 8);
    unsigned char got[8];
    OK(cuMemcpyDtoH_v2(got, p, 8));
    for (int i = 0; i < 8; i++) EXPECT(got[i] == i + 1);
    OK(cuLaunchKernel(k, 1, 1, 1, 32, 1, 1, 0, 0, 0, 0));
    OK(cuStreamSynchronize(0));
}

static void *second_thread(void *image) {
    return load_without_context(image);
}

static int contextless(const char *path) {
    const unsigned char *image = read_image(path);
    CUmodule early = load_without_context(image);
    printf("library loaded before any context: ok\n");
    CUcontext ctx;
    OK(cuDevicePrimaryCtxRetain(&ctx, 0));
    OK(cuCtxSetCurrent(ctx));
    use_with_context(early);
    pthread_t t;
    void *late = 0;
    EXPECT(pthread_create(&t, 0, second_thread, (void *)image) == 0);
    EXPECT(pthread_join(t, &late) == 0);
    printf("library loaded on a thread without a context: ok\n");
    use_with_context(late);
    OK(cuLibraryUnload(early));
    OK(cuLibraryUnload(late));
    printf("contextless: ok\n");
    return 0;
}

int main(int argc, char **argv) {
    OK(cuInit(0));
    if (argc > 2 && !strcmp(argv[1], "modules")) return modules(argv[2]);
    if (argc > 1 && !strcmp(argv[1], "tables")) return tables();
    if (argc > 2 && !strcmp(argv[1], "kernel-time")) return kernel_time(atoi(argv[2]));
    if (argc > 2 && !strcmp(argv[1], "contextless")) return contextless(argv[2]);
    fprintf(stderr, "usage: modcheck modules CUBIN | tables | kernel-time N | contextless CUBIN\n");
    return 2;
}
