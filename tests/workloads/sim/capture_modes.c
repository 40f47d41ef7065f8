/* capture_modes: which threads a capture forbids potentially unsafe calls, by the calling
 * thread's interaction mode (CUDA's rules of cudaThreadExchangeStreamCaptureMode), and the
 * virtual-memory calls among those calls. Prints "capture_modes: ok". */
#include <dlfcn.h>
#include <pthread.h>
#include "check.h"

typedef CUresult (*reserve_fn)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
typedef CUresult (*free_fn)(CUdeviceptr, size_t);
static reserve_fn reserve;
static free_fn unreserve;

static enum cudaStreamCaptureMode worker_mode;
static cudaError_t worker_got;

/* cudaMalloc in worker_mode on a thread of its own. */
static void *worker(void *arg) {
    (void)arg;
    enum cudaStreamCaptureMode m = worker_mode;
    CK(cudaThreadExchangeStreamCaptureMode(&m));
    void *p = NULL;
    worker_got = cudaMalloc(&p, 1 << 20);
    if (worker_got == cudaSuccess) CK(cudaFree(p));
    CK(cudaThreadExchangeStreamCaptureMode(&m));
    return NULL;
}

/* Capture s in `capture`, a worker in `worker` mode allocates: its result and the end's. */
static void case_(cudaStream_t s, enum cudaStreamCaptureMode capture, enum cudaStreamCaptureMode w,
                  cudaError_t want_worker, cudaError_t want_end) {
    cudaGraph_t g = NULL;
    CK(cudaStreamBeginCapture(s, capture));
    worker_mode = w;
    pthread_t t;
    EXPECT(pthread_create(&t, NULL, worker, NULL) == 0);
    pthread_join(t, NULL);
    EXPECT_EQ(worker_got, want_worker);
    EXPECT_EQ(cudaStreamEndCapture(s, &g), want_end);
}

int main(void) {
    CK(cudaSetDevice(0));
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    EXPECT(lib != NULL);
    reserve = (reserve_fn)dlsym(lib, "cuMemAddressReserve");
    unreserve = (free_fn)dlsym(lib, "cuMemAddressFree");
    EXPECT(reserve && unreserve);
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

    /* another thread's global capture forbids a thread in global mode, not one in
     * thread-local or relaxed mode; a thread-local or relaxed capture forbids no other thread */
    case_(s, cudaStreamCaptureModeGlobal, cudaStreamCaptureModeGlobal, cudaErrorStreamCaptureUnsupported,
          cudaErrorStreamCaptureInvalidated);
    case_(s, cudaStreamCaptureModeGlobal, cudaStreamCaptureModeThreadLocal, cudaSuccess, cudaSuccess);
    case_(s, cudaStreamCaptureModeGlobal, cudaStreamCaptureModeRelaxed, cudaSuccess, cudaSuccess);
    case_(s, cudaStreamCaptureModeThreadLocal, cudaStreamCaptureModeGlobal, cudaSuccess, cudaSuccess);
    case_(s, cudaStreamCaptureModeRelaxed, cudaStreamCaptureModeGlobal, cudaSuccess, cudaSuccess);

    /* a virtual-memory call on the capturing thread itself, thread-local capture: refused,
     * the capture invalidated; in relaxed mode it is allowed */
    cudaGraph_t g = NULL;
    CUdeviceptr va = 0;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    EXPECT_EQ(reserve(&va, 2 << 20, 0, 0, 0), 900);
    EXPECT_EQ(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    enum cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed;
    CK(cudaThreadExchangeStreamCaptureMode(&m));
    EXPECT_EQ(reserve(&va, 2 << 20, 0, 0, 0), 0);
    EXPECT_EQ(unreserve(va, 2 << 20), 0);
    CK(cudaThreadExchangeStreamCaptureMode(&m));
    CK(cudaStreamEndCapture(s, &g));

    CK(cudaStreamDestroy(s));
    printf("capture_modes: ok\n");
    return 0;
}
