/* cap_probe: exercises every charged allocation path and every memory-information query
 * against a VRAMSHIM_CAP, for the cap's integration tests (region/tests/cap_sim.rs).
 *
 *   cap_probe paths BELOW ABOVE [DEV]  for each path: allocate ABOVE bytes (expect the API's
 *                                      out-of-memory code), then BELOW bytes (expect success),
 *                                      free; prints "path=NAME above=RC below=RC last=E peek=E
 *                                      after=E" (runtime paths: the last-error state after the
 *                                      refusal as cudaPeekAtLastError, cudaGetLastError, then
 *                                      cudaGetLastError again, which must be cleared)
 *   cap_probe host SIZE                cudaMallocHost + cuMemCreate(host) of SIZE: never charged
 *   cap_probe info [DEV]               "info dev=D cuda_free= cuda_total= cu_free= cu_total=
 *                                      cu_devtotal= prop_total= nvml_total= nvml_free=
 *                                      nvml_used= nvml2_total= nvml2_free= nvml2_used=
 *                                      nvml2_reserved="
 *   cap_probe prealloc PERCENT         JAX/XLA style: cudaMemGetInfo, then one cudaMalloc of
 *                                      PERCENT% of total; prints "prealloc total= size= rc="
 *   cap_probe hold SIZE SECONDS [DEV] one cudaMalloc of SIZE on DEV; prints "hold rc=RC" and
 *                                      keeps it for SECONDS
 *   cap_probe hammer SECONDS THREADS MAX [HOLD_SECONDS]
 *                                      THREADS threads allocate random 2 MiB multiples up to MAX with
 *                                      cudaMalloc/cuMemAlloc and free them at random until
 *                                      SECONDS pass; prints "hammer ok= refused= other="
 *                                      (HOLD_SECONDS: then keep everything and sleep, so a
 *                                      test can SIGKILL a process holding memory)
 *   cap_probe fill SIZE COUNT          up to COUNT allocations of SIZE (cudaMalloc and
 *                                      cuMemAlloc in turn) until one is refused; prints
 *                                      "fill ok=N refused=R other=O free=F" (F: cudaMemGetInfo
 *                                      free while they are held), then frees them
 *   cap_probe poolmix POOLED UNPOOLED COUNT [HOLD_SECONDS]
 *                                      one cudaMalloc of POOLED, cudaFree, cudaDeviceSynchronize
 *                                      (with VRAMSHIM_POOL=stitch the pool keeps its pages
 *                                      cached), then the "info" line, then up to COUNT
 *                                      cuMemAllocPitch of UNPOOLED bytes (never pooled) until
 *                                      one is refused, then (UNPOOLED > 0) one cudaMalloc of
 *                                      POOLED again (again=-1 when not tried);
 *                                      prints "poolmix first=RC ok=N refused=R other=O free=F
 *                                      again=RC" (F: cudaMemGetInfo free after the fill);
 *                                      HOLD_SECONDS: then sleeps, holding everything
 *   cap_probe waitpair FIRST SECOND GO HOLD [CAPTURE]
 *                                      for VRAMSHIM_ON_CAP=wait: one cudaMalloc of FIRST, prints
 *                                      "first rc=RC"; then waits for GO (seconds, or a path: until
 *                                      that file exists); then (SECOND > 0) one cudaMalloc of
 *                                      SECOND (CAPTURE=1: cudaMallocAsync on a stream capturing a
 *                                      graph) and prints "second rc=RC ms=MS" (MS: how long the
 *                                      call took); keeps everything HOLD seconds, frees, exits
 *   cap_probe forks N SIZE             forks N children before any CUDA call; each makes one
 *                                      cudaMalloc of SIZE and holds it until all have tried;
 *                                      prints "forks ok=N refused=R other=O"
 */
#include <sys/wait.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "check.h"

typedef CUresult (*PFN_getPool)(CUmemoryPool *, CUdevice);
typedef CUresult (*PFN_allocFromPool)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
typedef CUresult (*PFN_streamSync)(CUstream);
typedef CUresult (*PFN_pitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
typedef CUresult (*PFN_managed)(CUdeviceptr *, size_t, unsigned int);
typedef CUresult (*PFN_totalMem)(size_t *, CUdevice);

static PFN_cuGetProcAddress_v2 gpa;
static void *drv(const char *sym) {
    void *p = NULL;
    CUdriverProcAddressQueryResult st;
    EXPECT_EQ(gpa(sym, &p, 12000, 0, &st), CUDA_SUCCESS);
    EXPECT(p != NULL);
    return p;
}

static PFN_cuMemAlloc_v2 d_alloc;
static PFN_cuMemFree_v2 d_free;
static PFN_pitch d_pitch;
static PFN_managed d_managed;
static PFN_cuMemAllocAsync d_async;
static PFN_cuMemFreeAsync d_free_async;
static PFN_allocFromPool d_from_pool;
static PFN_getPool d_get_pool;
static PFN_streamSync d_sync;
static PFN_cuMemCreate d_create;
static PFN_cuMemRelease d_release;
static PFN_cuMemGetInfo_v2 d_info;
static PFN_totalMem d_total;

static void setup(int dev) {
    CK(cudaSetDevice(dev));
    CK(cudaFree(0)); /* context */
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    EXPECT(h != NULL);
    gpa = (PFN_cuGetProcAddress_v2)dlsym(h, "cuGetProcAddress_v2");
    EXPECT(gpa != NULL);
    d_alloc = drv("cuMemAlloc");
    d_free = drv("cuMemFree");
    d_pitch = drv("cuMemAllocPitch");
    d_managed = drv("cuMemAllocManaged");
    d_async = drv("cuMemAllocAsync");
    d_free_async = drv("cuMemFreeAsync");
    d_from_pool = drv("cuMemAllocFromPoolAsync");
    d_get_pool = drv("cuDeviceGetDefaultMemPool");
    d_sync = drv("cuStreamSynchronize");
    d_create = drv("cuMemCreate");
    d_release = drv("cuMemRelease");
    d_info = drv("cuMemGetInfo");
    d_total = drv("cuDeviceTotalMem");
}

static int dev_g;

/* One allocation of `size` through path `p`; frees it on success. Returns the API's code. */
static int one(const char *p, size_t size) {
    int rc;
    if (!strcmp(p, "cudaMalloc")) {
        void *x = NULL;
        rc = cudaMalloc(&x, size);
        if (!rc) CK(cudaFree(x));
    } else if (!strcmp(p, "cudaMallocAsync")) {
        void *x = NULL;
        rc = cudaMallocAsync(&x, size, 0);
        if (!rc) { CK(cudaFreeAsync(x, 0)); CK(cudaDeviceSynchronize()); }
    } else if (!strcmp(p, "cudaMallocFromPoolAsync")) {
        void *x = NULL;
        cudaMemPool_t pool;
        CK(cudaDeviceGetDefaultMemPool(&pool, dev_g));
        rc = cudaMallocFromPoolAsync(&x, size, pool, 0);
        if (!rc) { CK(cudaFreeAsync(x, 0)); CK(cudaDeviceSynchronize()); }
    } else if (!strcmp(p, "cudaMallocPitch")) {
        void *x = NULL;
        size_t pitch = 0;
        rc = cudaMallocPitch(&x, &pitch, 1 << 20, size >> 20);
        if (!rc) CK(cudaFree(x));
    } else if (!strcmp(p, "cudaMalloc3D")) {
        struct cudaPitchedPtr pp;
        struct cudaExtent e = {1 << 20, size >> 24, 16};
        rc = cudaMalloc3D(&pp, e);
        if (!rc) CK(cudaFree(pp.ptr));
    } else if (!strcmp(p, "cudaMallocManaged")) {
        void *x = NULL;
        rc = cudaMallocManaged(&x, size, cudaMemAttachGlobal);
        if (!rc) CK(cudaFree(x));
    } else if (!strcmp(p, "cuMemAlloc")) {
        CUdeviceptr x = 0;
        rc = d_alloc(&x, size);
        if (!rc) EXPECT_EQ(d_free(x), CUDA_SUCCESS);
    } else if (!strcmp(p, "cuMemAllocPitch")) {
        CUdeviceptr x = 0;
        size_t pitch = 0;
        rc = d_pitch(&x, &pitch, 1 << 20, size >> 20, 16);
        if (!rc) EXPECT_EQ(d_free(x), CUDA_SUCCESS);
    } else if (!strcmp(p, "cuMemAllocManaged")) {
        CUdeviceptr x = 0;
        rc = d_managed(&x, size, 1);
        if (!rc) EXPECT_EQ(d_free(x), CUDA_SUCCESS);
    } else if (!strcmp(p, "cuMemAllocAsync")) {
        CUdeviceptr x = 0;
        rc = d_async(&x, size, 0);
        if (!rc) { EXPECT_EQ(d_free_async(x, 0), CUDA_SUCCESS); EXPECT_EQ(d_sync(0), CUDA_SUCCESS); }
    } else if (!strcmp(p, "cuMemAllocFromPoolAsync")) {
        CUdeviceptr x = 0;
        CUmemoryPool pool;
        EXPECT_EQ(d_get_pool(&pool, dev_g), CUDA_SUCCESS);
        rc = d_from_pool(&x, size, pool, 0);
        if (!rc) { EXPECT_EQ(d_free_async(x, 0), CUDA_SUCCESS); EXPECT_EQ(d_sync(0), CUDA_SUCCESS); }
    } else if (!strcmp(p, "cuMemCreate")) {
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = dev_g;
        CUmemGenericAllocationHandle hd = 0;
        rc = d_create(&hd, size, &prop, 0);
        if (!rc) EXPECT_EQ(d_release(hd), CUDA_SUCCESS);
    } else {
        fprintf(stderr, "unknown path %s\n", p);
        exit(2);
    }
    return rc;
}

static const char *PATHS[] = {
    "cudaMalloc", "cudaMallocAsync", "cudaMallocFromPoolAsync", "cudaMallocPitch", "cudaMalloc3D",
    "cudaMallocManaged", "cuMemAlloc", "cuMemAllocPitch", "cuMemAllocManaged", "cuMemAllocAsync",
    "cuMemAllocFromPoolAsync", "cuMemCreate",
};

static void info(int dev) {
    size_t cf = 0, ct = 0, uf = 0, ut = 0, dt = 0;
    CK(cudaMemGetInfo(&cf, &ct));
    EXPECT_EQ(d_info(&uf, &ut), CUDA_SUCCESS);
    EXPECT_EQ(d_total(&dt, dev), CUDA_SUCCESS);
    /* NULL out-pointers are tolerated. */
    CK(cudaMemGetInfo(NULL, &ct));
    CK(cudaMemGetInfo(&cf, NULL));
    struct cudaDeviceProp *prop = calloc(1, 4096);
    CK(cudaGetDeviceProperties(prop, dev));
    size_t prop_total = *(size_t *)((char *)prop + 288);
    free(prop);
    void *nv = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    EXPECT(nv != NULL);
    nvmlReturn_t (*n_init)(void) = (nvmlReturn_t(*)(void))dlsym(nv, "nvmlInit_v2");
    nvmlReturn_t (*n_handle)(unsigned, nvmlDevice_t *) =
        (nvmlReturn_t(*)(unsigned, nvmlDevice_t *))dlsym(nv, "nvmlDeviceGetHandleByIndex_v2");
    nvmlReturn_t (*n_mem)(nvmlDevice_t, nvmlMemory_t *) =
        (nvmlReturn_t(*)(nvmlDevice_t, nvmlMemory_t *))dlsym(nv, "nvmlDeviceGetMemoryInfo");
    nvmlReturn_t (*n_mem2)(nvmlDevice_t, nvmlMemory_v2_t *) =
        (nvmlReturn_t(*)(nvmlDevice_t, nvmlMemory_v2_t *))dlsym(nv, "nvmlDeviceGetMemoryInfo_v2");
    EXPECT(n_init && n_handle && n_mem && n_mem2);
    EXPECT_EQ(n_init(), 0);
    nvmlDevice_t h;
    EXPECT_EQ(n_handle(dev, &h), 0);
    nvmlMemory_t m;
    EXPECT_EQ(n_mem(h, &m), 0);
    nvmlMemory_v2_t m2;
    memset(&m2, 0, sizeof m2);
    m2.version = (unsigned)(sizeof(nvmlMemory_v2_t) | (2 << 24));
    EXPECT_EQ(n_mem2(h, &m2), 0);
    printf("info dev=%d cuda_free=%zu cuda_total=%zu cu_free=%zu cu_total=%zu cu_devtotal=%zu "
           "prop_total=%zu nvml_total=%llu nvml_free=%llu nvml_used=%llu nvml2_total=%llu "
           "nvml2_free=%llu nvml2_used=%llu nvml2_reserved=%llu\n",
           dev, cf, ct, uf, ut, dt, prop_total, (unsigned long long)m.total,
           (unsigned long long)m.free, (unsigned long long)m.used, (unsigned long long)m2.total,
           (unsigned long long)m2.free, (unsigned long long)m2.used,
           (unsigned long long)m2.reserved);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static double h_until;
static size_t h_max;
static unsigned long long h_ok, h_refused, h_other;
static pthread_mutex_t h_mu = PTHREAD_MUTEX_INITIALIZER;

static void *hammer_thread(void *arg) {
    uint64_t x = 0x9e3779b97f4a7c15ull ^ ((uint64_t)(uintptr_t)pthread_self() * 7919) ^ (uint64_t)getpid();
    void *held[64];
    int n = 0;
    unsigned long long ok = 0, refused = 0, other = 0;
    CK(cudaSetDevice(dev_g));
    while (now_s() < h_until) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        if ((x % 3 != 0 && n < 64) || n == 0) {
            /* 2 MiB multiples: the simulated driver charges exactly that (smaller requests
             * are packed into shared pages, so its accounting would differ from the cap's). */
            const size_t gran = 2u << 20;
            size_t size = h_max >= gran ? gran * (1 + (size_t)(x >> 8) % (h_max / gran))
                                        : 1 + (size_t)(x >> 8) % h_max;
            int rc;
            if (x & 1) {
                void *p = NULL;
                rc = cudaMalloc(&p, size);
                if (!rc) held[n++] = p;
                else cudaGetLastError();
            } else {
                CUdeviceptr p = 0;
                rc = d_alloc(&p, size);
                if (!rc) held[n++] = (void *)(uintptr_t)p;
            }
            if (!rc) ok++;
            else if (rc == 2) refused++;
            else other++;
        } else {
            int i = (int)((x >> 16) % (uint64_t)n);
            if (x & 2) CK(cudaFree(held[i]));
            else EXPECT_EQ(d_free((CUdeviceptr)(uintptr_t)held[i]), CUDA_SUCCESS);
            held[i] = held[--n];
        }
    }
    pthread_mutex_lock(&h_mu);
    h_ok += ok;
    h_refused += refused;
    h_other += other;
    pthread_mutex_unlock(&h_mu);
    if (arg == (void *)-1) return NULL;
    while (n > 0) CK(cudaFree(held[--n]));
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: see the comment at the top of cap_probe.c\n");
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "paths") && argc >= 4) {
        size_t below = strtoull(argv[2], NULL, 0), above = strtoull(argv[3], NULL, 0);
        dev_g = argc > 4 ? atoi(argv[4]) : 0;
        setup(dev_g);
        for (size_t i = 0; i < sizeof PATHS / sizeof *PATHS; i++) {
            const char *p = PATHS[i];
            int a = one(p, above);
            int peek = cudaPeekAtLastError(), last = cudaGetLastError(), after = cudaGetLastError();
            int b = one(p, below);
            printf("path=%s above=%d below=%d peek=%d last=%d after=%d\n", p, a, b, peek, last, after);
        }
        return 0;
    }
    if (!strcmp(cmd, "host") && argc >= 3) {
        size_t size = strtoull(argv[2], NULL, 0);
        setup(0);
        void *h = NULL;
        int rc = cudaMallocHost(&h, size);
        if (!rc) CK(cudaFreeHost(h));
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
        prop.location.id = 0;
        CUmemGenericAllocationHandle hd = 0;
        int rc2 = d_create(&hd, size, &prop, 0);
        if (!rc2) EXPECT_EQ(d_release(hd), CUDA_SUCCESS);
        printf("host cudaMallocHost=%d cuMemCreate_host=%d\n", rc, rc2);
        return 0;
    }
    if (!strcmp(cmd, "info")) {
        int dev = argc > 2 ? atoi(argv[2]) : 0;
        setup(dev);
        info(dev);
        return 0;
    }
    if (!strcmp(cmd, "prealloc") && argc >= 3) {
        double pct = atof(argv[2]);
        setup(0);
        size_t f = 0, t = 0;
        CK(cudaMemGetInfo(&f, &t));
        size_t size = (size_t)((double)t * pct / 100.0);
        void *p = NULL;
        int rc = cudaMalloc(&p, size);
        printf("prealloc total=%zu free=%zu size=%zu rc=%d\n", t, f, size, rc);
        return 0;
    }
    if (!strcmp(cmd, "hold") && argc >= 4) {
        size_t size = strtoull(argv[2], NULL, 0);
        double secs = atof(argv[3]);
        int dev = argc > 4 ? atoi(argv[4]) : 0;
        setup(dev);
        void *p = NULL;
        int rc = cudaMalloc(&p, size);
        printf("hold rc=%d\n", rc);
        fflush(stdout);
        if (secs > 0) usleep((useconds_t)(secs * 1e6));
        return 0;
    }
    if (!strcmp(cmd, "hammer") && argc >= 5) {
        double secs = atof(argv[2]);
        int threads = atoi(argv[3]);
        h_max = strtoull(argv[4], NULL, 0);
        double hold = argc > 5 ? atof(argv[5]) : 0;
        setup(0);
        h_until = now_s() + secs;
        pthread_t th[64];
        if (threads > 64) threads = 64;
        for (int i = 0; i < threads; i++)
            pthread_create(&th[i], NULL, hammer_thread, hold > 0 ? (void *)-1 : (void *)(uintptr_t)i);
        for (int i = 0; i < threads; i++) pthread_join(th[i], NULL);
        printf("hammer ok=%llu refused=%llu other=%llu\n", h_ok, h_refused, h_other);
        fflush(stdout);
        if (hold > 0) usleep((useconds_t)(hold * 1e6));
        return 0;
    }
    if (!strcmp(cmd, "fill") && argc >= 4) {
        size_t size = strtoull(argv[2], NULL, 0);
        long count = atol(argv[3]);
        setup(0);
        void **held = calloc((size_t)count, sizeof *held);
        EXPECT(held != NULL);
        long ok = 0, refused = 0, other = 0;
        for (long i = 0; i < count; i++) {
            int rc;
            if (i & 1) {
                CUdeviceptr p = 0;
                rc = d_alloc(&p, size);
                if (!rc) held[ok] = (void *)(uintptr_t)p;
            } else {
                void *p = NULL;
                rc = cudaMalloc(&p, size);
                if (!rc) held[ok] = p;
                else cudaGetLastError();
            }
            if (!rc) ok++;
            else if (rc == 2) { refused++; break; }
            else { other++; break; }
        }
        size_t f = 0, t = 0;
        CK(cudaMemGetInfo(&f, &t));
        printf("fill ok=%ld refused=%ld other=%ld free=%zu\n", ok, refused, other, f);
        fflush(stdout);
        for (long i = 0; i < ok; i++) CK(cudaFree(held[i]));
        free(held);
        return 0;
    }
    if (!strcmp(cmd, "poolmix") && argc >= 5) {
        size_t pooled = strtoull(argv[2], NULL, 0), unpooled = strtoull(argv[3], NULL, 0);
        long count = atol(argv[4]);
        double hold = argc > 5 ? atof(argv[5]) : 0;
        setup(0);
        void *p = NULL;
        int first = cudaMalloc(&p, pooled);
        if (!first) CK(cudaFree(p));
        else cudaGetLastError();
        CK(cudaDeviceSynchronize());
        info(0);
        CUdeviceptr *held = calloc((size_t)(count > 0 ? count : 1), sizeof *held);
        EXPECT(held != NULL);
        long ok = 0, refused = 0, other = 0;
        for (long i = 0; i < count; i++) {
            size_t pitch = 0;
            int rc = d_pitch(&held[ok], &pitch, 1 << 20, unpooled >> 20, 16);
            if (!rc) ok++;
            else if (rc == 2) { refused++; break; }
            else { other++; break; }
        }
        size_t f = 0, t = 0;
        CK(cudaMemGetInfo(&f, &t));
        void *q = NULL;
        int again = -1;
        if (unpooled > 0) {
            again = cudaMalloc(&q, pooled);
            if (again) cudaGetLastError();
        }
        printf("poolmix first=%d ok=%ld refused=%ld other=%ld free=%zu again=%d\n", first, ok,
               refused, other, f, again);
        fflush(stdout);
        if (hold > 0) usleep((useconds_t)(hold * 1e6));
        if (again == 0) CK(cudaFree(q));
        for (long i = 0; i < ok; i++) EXPECT_EQ(d_free(held[i]), CUDA_SUCCESS);
        free(held);
        return 0;
    }
    if (!strcmp(cmd, "waitpair") && argc >= 6) {
        size_t first = strtoull(argv[2], NULL, 0), second = strtoull(argv[3], NULL, 0);
        const char *go = argv[4];
        double hold = atof(argv[5]);
        int capture = argc > 6 && atoi(argv[6]) == 1;
        setup(0);
        void *p = NULL, *q = NULL;
        int rc = first ? cudaMalloc(&p, first) : 0;
        printf("first rc=%d\n", rc);
        fflush(stdout);
        if (go[0] == '/') {
            while (access(go, F_OK) != 0) usleep(10000);
        } else if (atof(go) > 0) {
            usleep((useconds_t)(atof(go) * 1e6));
        }
        if (second > 0) {
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            int rc2;
            if (capture) {
                cudaStream_t s;
                CK(cudaStreamCreate(&s));
                CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
                rc2 = cudaMallocAsync(&q, second, s);
                cudaGraph_t g = NULL;
                cudaStreamEndCapture(s, &g);
                if (g) cudaGraphDestroy(g);
                q = NULL;
            } else {
                rc2 = cudaMalloc(&q, second);
            }
            clock_gettime(CLOCK_MONOTONIC, &t1);
            long ms = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
            printf("second rc=%d ms=%ld\n", rc2, ms);
            fflush(stdout);
            if (rc2 != 0) q = NULL;
        }
        if (hold > 0) usleep((useconds_t)(hold * 1e6));
        if (q) CK(cudaFree(q));
        if (p && rc == 0) CK(cudaFree(p));
        return 0;
    }
    if (!strcmp(cmd, "forks") && argc >= 4) {
        int n = atoi(argv[2]);
        size_t size = strtoull(argv[3], NULL, 0);
        int results[2], release[2];
        EXPECT(pipe(results) == 0 && pipe(release) == 0);
        for (int i = 0; i < n; i++) {
            pid_t pid = fork();
            EXPECT(pid >= 0);
            if (pid == 0) {
                close(results[0]);
                close(release[1]);
                void *p = NULL;
                int rc = cudaMalloc(&p, size);
                unsigned char b = (unsigned char)(rc > 255 ? 255 : rc);
                EXPECT(write(results[1], &b, 1) == 1);
                char c;
                while (read(release[0], &c, 1) > 0) {}
                _exit(0);
            }
        }
        close(results[1]);
        close(release[0]);
        long ok = 0, refused = 0, other = 0;
        for (int i = 0; i < n; i++) {
            unsigned char b;
            if (read(results[0], &b, 1) != 1) { other++; continue; }
            if (b == 0) ok++;
            else if (b == 2) refused++;
            else other++;
        }
        close(release[1]);
        int status;
        while (wait(&status) > 0) {}
        printf("forks ok=%ld refused=%ld other=%ld\n", ok, refused, other);
        return 0;
    }
    fprintf(stderr, "bad arguments\n");
    return 2;
}
