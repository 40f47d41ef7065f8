/*
 * capture_threads - while one thread captures a stream into a graph, another allocates and
 * frees through the pool at sizes that make it reuse, order streams and grow: the capture
 * must end valid. CUDA forbids a thread potentially unsafe calls (an event query, a stream's
 * synchronization, cudaMalloc) while a capture applies to it (by the thread's interaction
 * mode: in global mode, every global-mode capture of another thread and its own; in
 * thread-local mode, its own; relaxed, none), refuses cuCtxSynchronize during any capture,
 * and such a call invalidates the capture; the virtual-memory calls the pool grows with are
 * allowed during any capture (tests/workloads/sim/driver_facts.expected). cuda-sim polices
 * exactly that.
 *
 *   capture_threads runtime|driver|lookup|tograph|drivertograph CAPTURE_MODE WORKER_MODE [self]
 *                   [badend] [blocking] [capped]
 *
 * CAPTURE_MODE, WORKER_MODE: global|local|relaxed. Before the capture: a 4 KiB block stays
 * allocated throughout, two 4 MiB blocks are allocated and freed (cudaFree), a 2 MiB block on
 * each of streams S1 and S2 (cudaMallocAsync, cudaFreeAsync), and the device synchronized (the
 * pool holds them cached). Then the main thread begins capturing stream SA
 * (runtime: cudaStreamBeginCapture; driver: cuStreamBeginCapture_v2 from dlsym; lookup:
 * cuStreamBeginCapture through cudaGetDriverEntryPoint; tograph: cudaStreamBeginCaptureToGraph
 * into a graph made by cudaGraphCreate; drivertograph: cuStreamBeginCaptureToGraph from dlsym)
 * and a worker thread, in WORKER_MODE
 * (cudaThreadExchangeStreamCaptureMode), does: cudaMalloc 4 MiB (a cached block), a 2 MiB
 * block on stream S1 filled and freed there (cudaMallocAsync/cudaFreeAsync), 2 MiB on stream
 * S2 (the pool may take S1's block behind an event), cudaMalloc 64 MiB (more than the pool
 * holds: it must grow), then frees everything it got. With "self" the capturing thread does
 * that work itself, between its begin and its end. With "badend" the capturing thread first
 * ends the capture with a null graph pointer, which the driver refuses (the capture goes on),
 * before the work. With "blocking" SA is a blocking stream (the legacy stream then depends on it:
 * CUDA refuses any use of the legacy stream while it captures). With "capped" the worker's one
 * request is a 128 MiB cudaMalloc, made first (run under a cap smaller than that: a cap
 * without the pool refuses it before CUDA is asked, so no call the capture forbids reaches the
 * driver unless the interposer makes one). The capture is then ended through the same entry
 * point.
 * Output: one line "capture_threads: served=N refused=N errors=N end=RC" (served: requests
 * that succeeded; refused: those answered cudaErrorStreamCaptureUnsupported, 900; errors:
 * any other failure; end: the end-capture call's result, 0 when the capture stayed valid,
 * 901 when it was invalidated). After the end, a 64 MiB cudaMalloc must succeed. Exit 1 if the
 * capture ended invalid, else 2 on any other failure.
 */
#include <pthread.h>
#include <string.h>

#define PROG "capture_threads"
#include "pool_workload.h"

typedef CUresult (*begin_fn)(CUstream, int);
typedef CUresult (*begin_to_graph_fn)(CUstream, void *, const void *, const void *, size_t, int);
typedef CUresult (*end_fn)(CUstream, void **);

static int mode_of(const char *m) {
    if (strcmp(m, "global") == 0) return cudaStreamCaptureModeGlobal;
    if (strcmp(m, "local") == 0) return cudaStreamCaptureModeThreadLocal;
    if (strcmp(m, "relaxed") == 0) return cudaStreamCaptureModeRelaxed;
    return -1;
}

static cudaStream_t s1, s2;
static int worker_mode, capped;
static long served, refused, errors;

static void count(cudaError_t e) {
    if (e == cudaSuccess)
        served++;
    else if (e == cudaErrorStreamCaptureUnsupported)
        refused++;
    else {
        fprintf(stderr, PROG ": request failed: %d\n", (int)e);
        errors++;
    }
}

static void *work(void *arg) {
    (void)arg;
    enum cudaStreamCaptureMode m = (enum cudaStreamCaptureMode)worker_mode;
    CHECK(cudaThreadExchangeStreamCaptureMode(&m));
    void *a = NULL, *b = NULL, *c = NULL, *big = NULL;
    if (capped) {
        cudaError_t e = cudaMalloc(&big, 128 << 20);
        count(e);
        if (big) CHECK(cudaFree(big));
        CHECK(cudaThreadExchangeStreamCaptureMode(&m));
        return NULL;
    }
    cudaError_t e = cudaMalloc(&a, 4 << 20);
    count(e);
    e = cudaMallocAsync(&b, 2 << 20, s1);
    count(e);
    if (e == cudaSuccess) {
        CHECK(vramsimKernelFill(b, 0xAA, 2 << 20, 10000, s1));
        CHECK(cudaFreeAsync(b, s1));
    }
    e = cudaMallocAsync(&c, 2 << 20, s2);
    count(e);
    e = cudaMalloc(&big, 64 << 20);
    count(e);
    if (a) CHECK(cudaFree(a));
    if (c) CHECK(cudaFreeAsync(c, s2));
    if (big) CHECK(cudaFree(big));
    /* back to the mode it had */
    CHECK(cudaThreadExchangeStreamCaptureMode(&m));
    return NULL;
}

int main(int argc, char **argv) {
    const char *usage =
        "usage: capture_threads runtime|driver|lookup|tograph|drivertograph global|local|relaxed "
        "global|local|relaxed [self] [badend] [blocking] [capped]\n";
    if (argc < 4) {
        fprintf(stderr, "%s", usage);
        return 2;
    }
    int self = 0, badend = 0, blocking = 0;
    for (int i = 4; i < argc; i++) {
        if (strcmp(argv[i], "self") == 0)
            self = 1;
        else if (strcmp(argv[i], "blocking") == 0)
            blocking = 1;
        else if (strcmp(argv[i], "badend") == 0)
            badend = 1;
        else if (strcmp(argv[i], "capped") == 0)
            capped = 1;
        else {
            fprintf(stderr, "%s", usage);
            return 2;
        }
    }
    const char *entry = argv[1];
    int capture_mode = mode_of(argv[2]);
    worker_mode = mode_of(argv[3]);
    if (capture_mode < 0 || worker_mode < 0) {
        fprintf(stderr, "%s", usage);
        return 2;
    }
    begin_fn begin = NULL;
    begin_to_graph_fn begin_to_graph = NULL;
    end_fn end = NULL;
    int to_graph = strcmp(entry, "tograph") == 0;
    if (strcmp(entry, "drivertograph") == 0) {
        void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
        if (lib) {
            begin_to_graph = (begin_to_graph_fn)dlsym(lib, "cuStreamBeginCaptureToGraph");
            end = (end_fn)dlsym(lib, "cuStreamEndCapture");
        }
        if (!begin_to_graph || !end) {
            fprintf(stderr, PROG ": no capture entry points\n");
            return 2;
        }
        to_graph = 1;
    } else if (to_graph) {
    } else if (strcmp(entry, "driver") == 0) {
        void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
        if (lib) {
            begin = (begin_fn)dlsym(lib, "cuStreamBeginCapture_v2");
            end = (end_fn)dlsym(lib, "cuStreamEndCapture");
        }
    } else if (strcmp(entry, "lookup") == 0) {
        cudaDriverEntryPointQueryResult st;
        CHECK(cudaGetDriverEntryPoint("cuStreamBeginCapture", (void **)&begin, cudaEnableDefault, &st));
        CHECK(cudaGetDriverEntryPoint("cuStreamEndCapture", (void **)&end, cudaEnableDefault, &st));
    } else if (strcmp(entry, "runtime") != 0) {
        fprintf(stderr, "%s", usage);
        return 2;
    }
    if (strcmp(entry, "runtime") != 0 && !to_graph && (!begin || !end)) {
        fprintf(stderr, PROG ": no capture entry points\n");
        return 2;
    }
    cudaStream_t sa;
    CHECK(cudaStreamCreateWithFlags(&sa, blocking ? cudaStreamDefault : cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    void *anchor = NULL, *w1 = NULL, *w2 = NULL, *w3 = NULL, *w4 = NULL;
    CHECK(cudaMalloc(&anchor, 4096));
    CHECK(cudaMalloc(&w1, 4 << 20));
    CHECK(cudaMalloc(&w2, 4 << 20));
    CHECK(cudaMallocAsync(&w3, 2 << 20, s1));
    CHECK(cudaMallocAsync(&w4, 2 << 20, s2));
    CHECK(cudaFree(w1));
    CHECK(cudaFree(w2));
    CHECK(cudaFreeAsync(w3, s1));
    CHECK(cudaFreeAsync(w4, s2));
    CHECK(cudaDeviceSynchronize());

    cudaGraph_t into = NULL;
    if (to_graph) CHECK(cudaGraphCreate(&into, 0));
    if (begin_to_graph) {
        CUresult rc = begin_to_graph((CUstream)sa, into, NULL, NULL, 0, capture_mode);
        if (rc != CUDA_SUCCESS) {
            fprintf(stderr, PROG ": cuStreamBeginCaptureToGraph failed: %d\n", (int)rc);
            return 2;
        }
    } else if (to_graph) {
        CHECK(cudaStreamBeginCaptureToGraph(sa, into, NULL, NULL, 0, (enum cudaStreamCaptureMode)capture_mode));
    } else if (begin) {
        CUresult rc = begin((CUstream)sa, capture_mode);
        if (rc != CUDA_SUCCESS) {
            fprintf(stderr, PROG ": cuStreamBeginCapture_v2 failed: %d\n", (int)rc);
            return 2;
        }
    } else {
        CHECK(cudaStreamBeginCapture(sa, (enum cudaStreamCaptureMode)capture_mode));
    }
    CHECK(vramsimKernelFill(anchor, 0x11, 4096, 0, sa));
    if (badend) {
        int rc = end ? (int)end((CUstream)sa, NULL) : (int)cudaStreamEndCapture(sa, NULL);
        if (rc == 0) {
            fprintf(stderr, PROG ": an end with a null graph pointer succeeded\n");
            return 2;
        }
    }
    if (self) {
        work(NULL);
    } else {
        pthread_t t;
        if (pthread_create(&t, NULL, work, NULL) != 0) {
            fprintf(stderr, PROG ": pthread_create failed\n");
            return 2;
        }
        pthread_join(t, NULL);
    }
    int end_rc;
    cudaGraph_t g = NULL;
    if (end)
        end_rc = (int)end((CUstream)sa, (void **)&g);
    else
        end_rc = (int)cudaStreamEndCapture(sa, &g);
    if (to_graph) {
        /* a capture into a graph ends in that graph */
        if (end_rc == 0 && g != into) {
            fprintf(stderr, PROG ": the capture ended in another graph\n");
            errors++;
        }
        CHECK(cudaGraphDestroy(into));
    } else if (end_rc == 0 && g) {
        CHECK(cudaGraphDestroy(g));
    }

    CHECK(cudaDeviceSynchronize());
    void *big = NULL;
    CHECK(cudaMalloc(&big, 64 << 20));
    CHECK(cudaFree(big));
    CHECK(cudaFree(anchor));
    CHECK(cudaStreamDestroy(sa));
    CHECK(cudaStreamDestroy(s1));
    CHECK(cudaStreamDestroy(s2));
    printf(PROG ": served=%ld refused=%ld errors=%ld end=%d\n", served, refused, errors, end_rc);
    if (end_rc != 0) return 1;
    return errors > 0 ? 2 : 0;
}
