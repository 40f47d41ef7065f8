/* graph_memory: a stream-ordered allocation during stream capture is a graph allocation node,
 * as in CUDA: its address is fixed at capture and is the same at every launch; the
 * allocation lives from a launch's reaching the node until a free node of the same graph, a
 * cudaFreeAsync / cudaFree outside it, or (AutoFreeOnLaunch) the next launch; a graph that
 * left it live cannot be launched again before it is freed; destroying a graph frees no live
 * allocation; a capture into a graph made by cudaGraphCreate (cudaStreamBeginCaptureToGraph) ends
 * in that graph. Graph memory attributes: used = live in launches, reserved = backing the
 * nodes. Prints "graph_memory: ok". */
#include "check.h"

static unsigned long long attr(int a) {
    unsigned long long v = 99;
    CK(cudaDeviceGetGraphMemAttribute(0, a, &v));
    return v;
}
#define USED attr(0)
#define RESERVED attr(2)

int main(void) {
    CK(cudaSetDevice(0));
    cudaStream_t cs, s;
    CK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    size_t free0 = 0, total = 0;
    CK(cudaMemGetInfo(&free0, &total));

    /* freed in its own graph: relaunched freely; not freeable outside */
    void *p = NULL;
    cudaGraph_t g = NULL;
    cudaGraphExec_t e = NULL;
    CK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal));
    CK(cudaMallocAsync(&p, 8 << 20, cs));
    EXPECT(p != NULL);
    CK(vramsimKernelFill(p, 0x5a, 8 << 20, 0, cs));
    CK(cudaFreeAsync(p, cs));
    EXPECT_EQ(cudaFreeAsync(p, cs), cudaErrorInvalidValue); /* freed once in its graph */
    CK(cudaStreamEndCapture(cs, &g));
    EXPECT_EQ(RESERVED, 8 << 20);
    EXPECT_EQ(USED, 0);
    CK(cudaGraphInstantiate(&e, g, 0));
    CK(cudaGraphLaunch(e, s));
    CK(cudaGraphLaunch(e, s));
    CK(cudaStreamSynchronize(s));
    EXPECT_EQ(USED, 0);
    EXPECT_EQ(cudaFreeAsync(p, s), cudaErrorInvalidValue);
    CK(cudaGraphExecDestroy(e));
    EXPECT_EQ(RESERVED, 8 << 20); /* the graph still holds it */
    CK(cudaGraphDestroy(g));
    EXPECT_EQ(RESERVED, 0);

    /* not freed in its graph: live after a launch, at the same address each time; freed
     * outside by cudaFreeAsync or cudaFree; a relaunch before that is refused */
    void *q = NULL;
    CK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal));
    CK(cudaMallocAsync(&q, 4 << 20, cs));
    CK(cudaStreamEndCapture(cs, &g));
    CK(cudaGraphInstantiate(&e, g, 0));
    CK(cudaGraphLaunch(e, s));
    EXPECT_EQ(USED, 4 << 20);
    CK(cudaMemsetAsync(q, 0, 4 << 20, s)); /* a stream operation after the launch may use it */
    EXPECT_EQ(cudaGraphLaunch(e, s), cudaErrorInvalidValue);
    CK(cudaFreeAsync(q, s));
    EXPECT_EQ(USED, 0);
    EXPECT_EQ(cudaFreeAsync(q, s), cudaErrorInvalidValue); /* not live */
    CK(cudaGraphLaunch(e, s));
    CK(cudaFree(q));
    CK(cudaGraphExecDestroy(e));
    /* AutoFreeOnLaunch: each launch frees what the last one left */
    CK(cudaGraphInstantiate(&e, g, cudaGraphInstantiateFlagAutoFreeOnLaunch));
    CK(cudaGraphLaunch(e, s));
    CK(cudaGraphLaunch(e, s));
    EXPECT_EQ(USED, 4 << 20);
    /* destroying the graphs frees no live allocation */
    CK(cudaGraphExecDestroy(e));
    CK(cudaGraphDestroy(g));
    EXPECT_EQ(RESERVED, 4 << 20);
    CK(cudaFreeAsync(q, s));
    CK(cudaStreamSynchronize(s));
    EXPECT_EQ(RESERVED, 0);
    EXPECT_EQ(USED, 0);
    EXPECT(attr(1) >= 4 << 20); /* the high-water marks */
    EXPECT(attr(3) >= 8 << 20);

    /* a capture into an existing graph (cudaStreamBeginCaptureToGraph): its end returns that
     * graph, with the capture's nodes */
    cudaGraph_t into = NULL, got = NULL;
    void *t = NULL;
    CK(cudaGraphCreate(&into, 0));
    EXPECT_EQ(cudaStreamBeginCaptureToGraph(cs, (cudaGraph_t)0x1234, NULL, NULL, 0, cudaStreamCaptureModeGlobal),
              cudaErrorInvalidValue);
    CK(cudaStreamBeginCaptureToGraph(cs, into, NULL, NULL, 0, cudaStreamCaptureModeGlobal));
    CK(cudaMallocAsync(&t, 2 << 20, cs));
    CK(cudaStreamEndCapture(cs, &got));
    EXPECT(got == into);
    EXPECT_EQ(RESERVED, 2 << 20);
    CK(cudaGraphInstantiate(&e, into, cudaGraphInstantiateFlagAutoFreeOnLaunch));
    CK(cudaGraphLaunch(e, s));
    EXPECT_EQ(USED, 2 << 20);
    CK(cudaFreeAsync(t, s));
    CK(cudaStreamSynchronize(s));
    CK(cudaGraphExecDestroy(e));
    CK(cudaGraphDestroy(into));
    EXPECT_EQ(RESERVED, 0);

    /* an invalidated capture's nodes go with it; its stream-ordered calls answer 901 */
    void *r = NULL, *x = NULL;
    CK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal));
    CK(cudaMallocAsync(&r, 2 << 20, cs));
    EXPECT_EQ(cudaMalloc(&x, 1 << 20), cudaErrorStreamCaptureUnsupported);
    EXPECT_EQ(cudaMallocAsync(&x, 1 << 20, cs), cudaErrorStreamCaptureInvalidated);
    EXPECT_EQ(cudaStreamEndCapture(cs, &g), cudaErrorStreamCaptureInvalidated);
    EXPECT_EQ(RESERVED, 0);

    size_t free1 = 0;
    CK(cudaMemGetInfo(&free1, &total));
    EXPECT_EQ(free1, free0);
    CK(cudaStreamDestroy(cs));
    CK(cudaStreamDestroy(s));
    printf("graph_memory: ok\n");
    return 0;
}
