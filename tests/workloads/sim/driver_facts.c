/* driver_facts: asks the CUDA driver the questions vramshim's pool and capture handling are
 * built on, and prints one `fact NAME=VALUE` line per answer (CUresult codes, capture
 * statuses, 1/0 for yes/no). Run on cuda-sim its answers are the simulator's; run on a real
 * GPU (scripts/gpu-smoke.sh) they are the driver's, and the script compares the two, so that
 * a simulator that answers differently from the hardware is found rather than trusted.
 *
 * Driver API only, reached through dlopen("libcuda.so.1"): no toolkit or runtime needed.
 * Each question uses fresh streams and handles, so one refusal does not change the next. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cuda_api.h"

typedef int capture_status; /* CUstreamCaptureStatus: 0 none, 1 active, 2 invalidated */
typedef void *graph_t;

static CUresult (*p_init)(unsigned);
static CUresult (*p_retain)(CUcontext *, CUdevice);
static CUresult (*p_set_current)(CUcontext);
static CUresult (*p_granularity)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags);
static CUresult (*p_create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
static CUresult (*p_release)(CUmemGenericAllocationHandle);
static CUresult (*p_reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
static CUresult (*p_unreserve)(CUdeviceptr, size_t);
static CUresult (*p_map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
static CUresult (*p_unmap)(CUdeviceptr, size_t);
static CUresult (*p_set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
static CUresult (*p_htod)(CUdeviceptr, const void *, size_t);
static CUresult (*p_dtoh)(void *, CUdeviceptr, size_t);
static CUresult (*p_alloc)(CUdeviceptr *, size_t);
static CUresult (*p_free)(CUdeviceptr);
static CUresult (*p_alloc_async)(CUdeviceptr *, size_t, CUstream);
static CUresult (*p_free_async)(CUdeviceptr, CUstream);
static CUresult (*p_stream_create)(CUstream *, unsigned);
static CUresult (*p_stream_destroy)(CUstream);
static CUresult (*p_stream_sync)(CUstream);
static CUresult (*p_begin)(CUstream, int);
static CUresult (*p_end)(CUstream, graph_t *);
static CUresult (*p_is_capturing)(CUstream, capture_status *);
static CUresult (*p_event_create)(CUevent *, unsigned);
static CUresult (*p_event_record)(CUevent, CUstream);
static CUresult (*p_event_destroy)(CUevent);
static CUresult (*p_wait_event)(CUstream, CUevent, unsigned);
static CUresult (*p_graph_destroy)(graph_t);
static CUresult (*p_ctx_sync)(void);
static CUresult (*p_mem_get_info)(size_t *, size_t *);
static CUresult (*p_event_query)(CUevent);
static CUresult (*p_event_sync)(CUevent);
static CUresult (*p_stream_query)(CUstream);
static CUresult (*p_default_pool)(CUmemoryPool *, CUdevice);
static CUresult (*p_pool_trim)(CUmemoryPool, size_t);

static void *lib;

static void *sym(const char *name) {
    void *f = dlsym(lib, name);
    if (!f) {
        fprintf(stderr, "driver_facts: the driver has no %s\n", name);
        exit(2);
    }
    return f;
}

#define MUST(call)                                                                  \
    do {                                                                            \
        CUresult r_ = (call);                                                       \
        if (r_ != CUDA_SUCCESS) {                                                   \
            fprintf(stderr, "driver_facts: %s failed: %d (line %d)\n", #call, (int)r_, \
                    __LINE__);                                                      \
            exit(2);                                                                \
        }                                                                           \
    } while (0)

/* A clean-up after a question: reported, never fatal, so one odd answer does not cost the
 * answers to the questions after it. */
#define SOFT(call)                                                                  \
    do {                                                                            \
        CUresult r_ = (call);                                                       \
        if (r_ != CUDA_SUCCESS)                                                     \
            fprintf(stderr, "driver_facts: clean-up %s failed: %d (line %d)\n", #call, \
                    (int)r_, __LINE__);                                             \
    } while (0)

static void fact(const char *name, long v) { printf("fact %s=%ld\n", name, v); }

static CUcontext ctx;

static CUmemAllocationProp prop;
static CUmemAccessDesc rw;
static size_t gran;

static CUmemGenericAllocationHandle handle(size_t pages) {
    CUmemGenericAllocationHandle h;
    MUST(p_create(&h, pages * gran, &prop, 0));
    return h;
}

static CUdeviceptr reserve(size_t pages) {
    CUdeviceptr va;
    MUST(p_reserve(&va, pages * gran, 0, 0, 0));
    return va;
}

/* Fills `n` bytes at `va` with `byte` through a copy from the host. */
static void fill(CUdeviceptr va, unsigned char byte, size_t n) {
    unsigned char *buf = malloc(n);
    memset(buf, byte, n);
    MUST(p_htod(va, buf, n));
    free(buf);
}

/* Whether every one of `n` bytes at `va` reads `byte`. */
static int holds(CUdeviceptr va, unsigned char byte, size_t n) {
    unsigned char *buf = malloc(n);
    MUST(p_dtoh(buf, va, n));
    int all = 1;
    for (size_t i = 0; i < n; i++) all &= buf[i] == byte;
    free(buf);
    return all;
}

/* One page of a two-page handle mapped at an offset: whether the driver takes it (a stitched
 * range could then map a run of pages in one call), and if it does, whether it shows the same
 * bytes as the whole handle's mapping there. */
static void map_at_offset(void) {
    CUmemGenericAllocationHandle h = handle(2);
    CUdeviceptr one = reserve(1), whole = reserve(2);
    CUresult r = p_map(one, gran, gran, h, 0);
    fact("map_offset", r);
    long aliases = -1;
    if (r == CUDA_SUCCESS) {
        MUST(p_set_access(one, gran, &rw, 1));
        MUST(p_map(whole, 2 * gran, 0, h, 0));
        MUST(p_set_access(whole, 2 * gran, &rw, 1));
        fill(whole, 0x11, 2 * gran);
        fill(one, 0x5a, gran);
        aliases = holds(whole + gran, 0x5a, gran) && holds(whole, 0x11, gran);
        MUST(p_unmap(whole, 2 * gran));
        MUST(p_unmap(one, gran));
    }
    fact("map_offset_same_bytes", aliases);
    MUST(p_unreserve(one, gran));
    MUST(p_unreserve(whole, 2 * gran));
    MUST(p_release(h));
}

/* One handle mapped at two addresses at once, both readable and writable, one memory: the
 * stitch pool maps a free page of one range into a new range while the first still maps it. */
static void map_twice(void) {
    CUmemGenericAllocationHandle h = handle(1);
    CUdeviceptr a = reserve(1), b = reserve(1);
    MUST(p_map(a, gran, 0, h, 0));
    MUST(p_set_access(a, gran, &rw, 1));
    CUresult r = p_map(b, gran, 0, h, 0);
    fact("map_twice", r);
    long same = -1;
    if (r == CUDA_SUCCESS) {
        MUST(p_set_access(b, gran, &rw, 1));
        fill(a, 0x33, gran);
        same = holds(b, 0x33, gran);
        fill(b, 0x44, gran);
        same &= holds(a, 0x44, gran);
        MUST(p_unmap(b, gran));
    }
    fact("map_twice_same_bytes", same);
    MUST(p_unmap(a, gran));
    MUST(p_unreserve(a, gran));
    MUST(p_unreserve(b, gran));
    MUST(p_release(h));
}

/* Two handles mapped side by side: one cuMemSetAccess over both (one call for a range stitched
 * from several handles), and unmapping one page of a two-page mapping (the pool unmaps whole
 * mappings only). */
static void access_and_unmap(void) {
    CUmemGenericAllocationHandle h1 = handle(1), h2 = handle(1), h3 = handle(2);
    CUdeviceptr va = reserve(2), wide = reserve(2);
    MUST(p_map(va, gran, 0, h1, 0));
    MUST(p_map(va + gran, gran, 0, h2, 0));
    fact("set_access_over_two_mappings", p_set_access(va, 2 * gran, &rw, 1));
    MUST(p_map(wide, 2 * gran, 0, h3, 0));
    MUST(p_set_access(wide, 2 * gran, &rw, 1));
    CUresult r = p_unmap(wide, gran);
    fact("unmap_part_of_a_mapping", r);
    if (r == CUDA_SUCCESS)
        MUST(p_unmap(wide + gran, gran));
    else
        MUST(p_unmap(wide, 2 * gran));
    MUST(p_unmap(va, gran));
    MUST(p_unmap(va + gran, gran));
    MUST(p_unreserve(va, 2 * gran));
    MUST(p_unreserve(wide, 2 * gran));
    MUST(p_release(h1));
    MUST(p_release(h2));
    MUST(p_release(h3));
}

/* A stream-ordered free, during a relaxed capture of `s`, of memory the capture did not
 * allocate: what the free returns, the capture's status after it, and what ending it returns. */
static void free_in_capture(const char *what, CUdeviceptr p) {
    CUstream s;
    MUST(p_stream_create(&s, 1));
    MUST(p_begin(s, 2));
    char name[96];
    snprintf(name, sizeof name, "capture_free_%s", what);
    fact(name, p_free_async(p, s));
    capture_status st = -1;
    MUST(p_is_capturing(s, &st));
    snprintf(name, sizeof name, "capture_free_%s_status", what);
    fact(name, st);
    graph_t g = NULL;
    snprintf(name, sizeof name, "capture_free_%s_end", what);
    fact(name, p_end(s, &g));
    if (g) MUST(p_graph_destroy(g));
    MUST(p_stream_destroy(s));
}

static void frees_in_capture(void) {
    CUstream s;
    MUST(p_stream_create(&s, 1));
    CUdeviceptr pooled;
    MUST(p_alloc_async(&pooled, 1 << 20, s));
    MUST(p_stream_sync(s));
    free_in_capture("stream_ordered", pooled);
    /* whatever the capture did with it, the memory is still the program's or already gone:
     * a second free outside any capture tells which */
    CUresult again = p_free_async(pooled, s);
    fact("capture_free_stream_ordered_then_free", again);
    MUST(p_stream_sync(s));

    CUdeviceptr plain;
    MUST(p_alloc(&plain, 1 << 20));
    free_in_capture("mem_alloc", plain);
    fact("capture_free_mem_alloc_then_free", p_free(plain));

    CUmemGenericAllocationHandle h = handle(1);
    CUdeviceptr va = reserve(1);
    MUST(p_map(va, gran, 0, h, 0));
    MUST(p_set_access(va, gran, &rw, 1));
    free_in_capture("mapped", va);
    /* the same free outside any capture: what the library's captured free of a pool block
     * meets when the capture ends between its question and the driver's answer */
    CUstream t;
    MUST(p_stream_create(&t, 1));
    fact("free_async_mapped_outside_capture", p_free_async(va, t));
    MUST(p_stream_sync(t));
    MUST(p_stream_destroy(t));
    MUST(p_unmap(va, gran));
    MUST(p_unreserve(va, gran));
    MUST(p_release(h));
    MUST(p_stream_destroy(s));
}

/* A stream that waits on an event recorded in a capture joins it: its status, and an
 * allocation on it becoming part of the graph (ended cleanly once it joins back). */
static void joined_stream(void) {
    CUstream s1, s2;
    CUevent fork, join;
    MUST(p_stream_create(&s1, 1));
    MUST(p_stream_create(&s2, 1));
    MUST(p_event_create(&fork, 0));
    MUST(p_event_create(&join, 0));
    MUST(p_begin(s1, 2));
    MUST(p_event_record(fork, s1));
    CUresult waited = p_wait_event(s2, fork, 0);
    fact("joined_wait", waited);
    capture_status st = -1;
    MUST(p_is_capturing(s2, &st));
    fact("joined_status", st);
    if (waited == CUDA_SUCCESS) {
        CUdeviceptr p = 0;
        fact("joined_alloc", p_alloc_async(&p, 1 << 20, s2));
        if (p) fact("joined_free", p_free_async(p, s2));
        MUST(p_event_record(join, s2));
        fact("joined_rejoin", p_wait_event(s1, join, 0));
    }
    graph_t g = NULL;
    fact("joined_end", p_end(s1, &g));
    st = -1;
    MUST(p_is_capturing(s2, &st));
    fact("joined_status_after_end", st);
    if (g) MUST(p_graph_destroy(g));
    MUST(p_event_destroy(fork));
    MUST(p_event_destroy(join));
    MUST(p_stream_destroy(s1));
    MUST(p_stream_destroy(s2));
}

/* A fork never joined back: a stream joins the capture, captures work, and the origin ends
 * the capture without waiting on it. The end's result, whether a graph came back, and the
 * forked stream's status afterwards. */
static void unjoined_fork(void) {
    CUstream s1, s2;
    CUevent fork;
    MUST(p_stream_create(&s1, 1));
    MUST(p_stream_create(&s2, 1));
    MUST(p_event_create(&fork, 0));
    MUST(p_begin(s1, 2));
    MUST(p_event_record(fork, s1));
    MUST(p_wait_event(s2, fork, 0));
    CUdeviceptr p = 0;
    MUST(p_alloc_async(&p, 1 << 20, s2));
    MUST(p_free_async(p, s2));
    graph_t g = NULL;
    fact("unjoined_end", p_end(s1, &g));
    fact("unjoined_graph", g != NULL);
    capture_status st = -1;
    MUST(p_is_capturing(s2, &st));
    fact("unjoined_status_after_end", st);
    if (g) MUST(p_graph_destroy(g));
    MUST(p_event_destroy(fork));
    MUST(p_stream_destroy(s1));
    MUST(p_stream_destroy(s2));
}

/* Two captures under way; a stream of one waits on an event recorded in the other. The wait's
 * result, the waiting stream's status after it, and how each capture ends. */
static void merge_wait(void) {
    CUstream s1, s2;
    CUevent e;
    MUST(p_stream_create(&s1, 1));
    MUST(p_stream_create(&s2, 1));
    MUST(p_event_create(&e, 0));
    MUST(p_begin(s1, 2));
    MUST(p_begin(s2, 2));
    MUST(p_event_record(e, s1));
    fact("merge_wait", p_wait_event(s2, e, 0));
    capture_status st = -1;
    MUST(p_is_capturing(s2, &st));
    fact("merge_status", st);
    graph_t g1 = NULL, g2 = NULL;
    fact("merge_waiter_end", p_end(s2, &g2));
    fact("merge_recorder_end", p_end(s1, &g1));
    if (g1) MUST(p_graph_destroy(g1));
    if (g2) MUST(p_graph_destroy(g2));
    MUST(p_event_destroy(e));
    MUST(p_stream_destroy(s1));
    MUST(p_stream_destroy(s2));
}

/* The calls the library makes, or lets through, while a capture may be under way on some
 * stream: which of them a capture forbids, and whether a forbidden one invalidates it. */
enum {
    K_MEM_ALLOC, K_MEM_FREE, K_CTX_SYNC, K_MEM_CREATE, K_MEM_RELEASE, K_ADDRESS_RESERVE,
    K_ADDRESS_FREE, K_MEM_MAP, K_MEM_UNMAP, K_SET_ACCESS, K_MEM_GET_INFO, K_EVENT_QUERY,
    K_OTHER_STREAM_SYNC, K_ALLOC_ASYNC_OTHER_STREAM, K_FREE_ASYNC_OTHER_STREAM,
    K_EVENT_CREATE, K_EVENT_DESTROY, K_EVENT_RECORD_OTHER_STREAM, K_EVENT_SYNC,
    K_STREAM_QUERY_OTHER_STREAM, K_WAIT_OTHER_STREAM, K_LEGACY_STREAM_SYNC, K_POOL_TRIM,
    K_MEM_FREE_BAD_ADDRESS, K_COUNT
};
static const char *const kind_name[K_COUNT] = {
    "mem_alloc", "mem_free", "ctx_sync", "mem_create", "mem_release", "address_reserve",
    "address_free", "mem_map", "mem_unmap", "set_access", "mem_get_info", "event_query",
    "other_stream_sync", "alloc_async_other_stream", "free_async_other_stream",
    "event_create", "event_destroy", "event_record_other_stream", "event_sync",
    "stream_query_other_stream", "wait_other_stream", "legacy_stream_sync", "pool_trim",
    "mem_free_bad_address",
};

/* One call asked during a capture: what it needs made before the capture, and what is left
 * to undo after it. */
struct call {
    int kind;
    CUdeviceptr dptr;
    CUmemGenericAllocationHandle h;
    CUdeviceptr va;
    int held, reserved, mapped;
    CUstream other, other2;
    CUevent ev;
    CUevent ev2;
    CUresult r;
};

static void prepare(struct call *c) {
    switch (c->kind) {
    case K_MEM_FREE:
        MUST(p_alloc(&c->dptr, 1 << 20));
        break;
    case K_MEM_RELEASE:
        c->h = handle(1), c->held = 1;
        break;
    case K_ADDRESS_FREE:
        c->va = reserve(1), c->reserved = 1;
        break;
    case K_MEM_MAP:
    case K_MEM_UNMAP:
    case K_SET_ACCESS:
        c->h = handle(1), c->held = 1;
        c->va = reserve(1), c->reserved = 1;
        if (c->kind != K_MEM_MAP) {
            MUST(p_map(c->va, gran, 0, c->h, 0));
            c->mapped = 1;
        }
        break;
    case K_EVENT_QUERY:
    case K_OTHER_STREAM_SYNC:
    case K_ALLOC_ASYNC_OTHER_STREAM:
    case K_FREE_ASYNC_OTHER_STREAM:
    case K_EVENT_RECORD_OTHER_STREAM:
    case K_EVENT_SYNC:
    case K_STREAM_QUERY_OTHER_STREAM:
    case K_WAIT_OTHER_STREAM:
        MUST(p_stream_create(&c->other, 1));
        MUST(p_event_create(&c->ev, 0));
        MUST(p_event_record(c->ev, c->other));
        MUST(p_stream_sync(c->other));
        if (c->kind == K_FREE_ASYNC_OTHER_STREAM) {
            MUST(p_alloc_async(&c->dptr, 1 << 20, c->other));
            MUST(p_stream_sync(c->other));
        }
        if (c->kind == K_WAIT_OTHER_STREAM) {
            MUST(p_stream_create(&c->other2, 1));
        }
        break;
    case K_EVENT_DESTROY:
        MUST(p_event_create(&c->ev2, 0));
        break;
    }
}

static void perform(struct call *c) {
    size_t free_b, total_b;
    switch (c->kind) {
    case K_MEM_ALLOC: c->r = p_alloc(&c->dptr, 1 << 20); break;
    case K_MEM_FREE:
        c->r = p_free(c->dptr);
        if (c->r == CUDA_SUCCESS) c->dptr = 0;
        break;
    case K_CTX_SYNC: c->r = p_ctx_sync(); break;
    case K_MEM_CREATE:
        c->r = p_create(&c->h, gran, &prop, 0);
        c->held = c->r == CUDA_SUCCESS;
        break;
    case K_MEM_RELEASE:
        c->r = p_release(c->h);
        c->held = c->r != CUDA_SUCCESS;
        break;
    case K_ADDRESS_RESERVE:
        c->r = p_reserve(&c->va, gran, 0, 0, 0);
        c->reserved = c->r == CUDA_SUCCESS;
        break;
    case K_ADDRESS_FREE:
        c->r = p_unreserve(c->va, gran);
        c->reserved = c->r != CUDA_SUCCESS;
        break;
    case K_MEM_MAP:
        c->r = p_map(c->va, gran, 0, c->h, 0);
        c->mapped = c->r == CUDA_SUCCESS;
        break;
    case K_MEM_UNMAP:
        c->r = p_unmap(c->va, gran);
        c->mapped = c->r != CUDA_SUCCESS;
        break;
    case K_SET_ACCESS: c->r = p_set_access(c->va, gran, &rw, 1); break;
    case K_MEM_GET_INFO: c->r = p_mem_get_info(&free_b, &total_b); break;
    case K_EVENT_QUERY: c->r = p_event_query(c->ev); break;
    case K_OTHER_STREAM_SYNC: c->r = p_stream_sync(c->other); break;
    case K_ALLOC_ASYNC_OTHER_STREAM: c->r = p_alloc_async(&c->dptr, 1 << 20, c->other); break;
    case K_FREE_ASYNC_OTHER_STREAM:
        c->r = p_free_async(c->dptr, c->other);
        if (c->r == CUDA_SUCCESS) c->dptr = 0;
        break;
    case K_EVENT_CREATE: c->r = p_event_create(&c->ev2, 0); break;
    case K_EVENT_DESTROY:
        c->r = p_event_destroy(c->ev2);
        if (c->r == CUDA_SUCCESS) c->ev2 = NULL;
        break;
    case K_EVENT_RECORD_OTHER_STREAM: c->r = p_event_record(c->ev, c->other); break;
    case K_EVENT_SYNC: c->r = p_event_sync(c->ev); break;
    case K_STREAM_QUERY_OTHER_STREAM: c->r = p_stream_query(c->other); break;
    case K_WAIT_OTHER_STREAM: c->r = p_wait_event(c->other2, c->ev, 0); break;
    case K_LEGACY_STREAM_SYNC: c->r = p_stream_sync((CUstream)(uintptr_t)1); break;
    case K_POOL_TRIM: {
        CUmemoryPool pool = NULL;
        MUST(p_default_pool(&pool, 0));
        c->r = p_pool_trim(pool, 0);
        break;
    }
    case K_MEM_FREE_BAD_ADDRESS: c->r = p_free((CUdeviceptr)0x10); break;
    }
}

static void undo(struct call *c) {
    if (c->dptr && (c->kind == K_ALLOC_ASYNC_OTHER_STREAM || c->kind == K_FREE_ASYNC_OTHER_STREAM))
        SOFT(p_free_async(c->dptr, c->other));
    else if (c->dptr)
        SOFT(p_free(c->dptr));
    if (c->mapped) SOFT(p_unmap(c->va, gran));
    if (c->reserved) SOFT(p_unreserve(c->va, gran));
    if (c->held) SOFT(p_release(c->h));
    if (c->other) {
        SOFT(p_stream_sync(c->other));
        SOFT(p_stream_destroy(c->other));
    }
    if (c->other2) {
        SOFT(p_stream_sync(c->other2));
        SOFT(p_stream_destroy(c->other2));
    }
    if (c->ev) SOFT(p_event_destroy(c->ev));
    if (c->ev2) SOFT(p_event_destroy(c->ev2));
}

static void *perform_on_other_thread(void *arg) {
    MUST(p_set_current(ctx));
    perform(arg);
    return NULL;
}

/* Begins a capture of a fresh stream in `mode` (0 global, 1 thread-local, 2 relaxed), makes
 * one call on this thread or another, and reports the call's result and the capture's status
 * after it (2: invalidated, so its end fails with 901). */
static void ask_in_capture(const char *situation, int mode, int other_thread, int kind) {
    struct call c;
    memset(&c, 0, sizeof c);
    c.kind = kind;
    prepare(&c);
    CUstream s;
    MUST(p_stream_create(&s, 1));
    MUST(p_begin(s, mode));
    if (other_thread) {
        pthread_t t;
        if (pthread_create(&t, NULL, perform_on_other_thread, &c) != 0) {
            fprintf(stderr, "driver_facts: pthread_create failed\n");
            exit(2);
        }
        pthread_join(t, NULL);
    } else {
        perform(&c);
    }
    capture_status st = -1;
    MUST(p_is_capturing(s, &st));
    graph_t g = NULL;
    CUresult end = p_end(s, &g);
    if (g) SOFT(p_graph_destroy(g));
    char name[128];
    snprintf(name, sizeof name, "in_capture_%s_%s", situation, kind_name[kind]);
    fact(name, c.r);
    snprintf(name, sizeof name, "in_capture_%s_%s_status", situation, kind_name[kind]);
    fact(name, st);
    if ((st == 2) != (end != CUDA_SUCCESS))
        fprintf(stderr, "driver_facts: %s: status %d but the end answered %d\n", name, st, end);
    undo(&c);
    SOFT(p_stream_destroy(s));
}

static void calls_in_capture(void) {
    for (int k = 0; k < K_COUNT; k++) {
        ask_in_capture("global", 0, 0, k);
        ask_in_capture("relaxed", 2, 0, k);
        ask_in_capture("global_other_thread", 0, 1, k);
        ask_in_capture("thread_local_other_thread", 1, 1, k);
    }
}

/* An event recorded in a capture that has since ended, waited on by a stream outside any
 * capture and by a stream in a new capture. */
static void ended_capture_event(void) {
    CUstream s1, s2;
    CUevent e;
    MUST(p_stream_create(&s1, 1));
    MUST(p_stream_create(&s2, 1));
    MUST(p_event_create(&e, 0));
    MUST(p_begin(s1, 2));
    MUST(p_event_record(e, s1));
    graph_t g = NULL;
    MUST(p_end(s1, &g));
    if (g) SOFT(p_graph_destroy(g));
    fact("ended_capture_event_wait", p_wait_event(s2, e, 0));
    SOFT(p_stream_sync(s2));
    MUST(p_begin(s2, 2));
    fact("ended_capture_event_wait_in_capture", p_wait_event(s2, e, 0));
    capture_status st = -1;
    MUST(p_is_capturing(s2, &st));
    fact("ended_capture_event_wait_in_capture_status", st);
    g = NULL;
    fact("ended_capture_event_wait_in_capture_end", p_end(s2, &g));
    if (g) SOFT(p_graph_destroy(g));
    SOFT(p_event_destroy(e));
    SOFT(p_stream_destroy(s1));
    SOFT(p_stream_destroy(s2));
}

/* cuCtxSynchronize while a capture is invalidated but not yet ended: the first synchronization
 * is refused and invalidates the capture (asked above); whether the stream, still in capture
 * mode until its end, refuses a second one too; and after the end. */
static void ctx_sync_while_invalidated(void) {
    CUstream s;
    MUST(p_stream_create(&s, 1));
    MUST(p_begin(s, 2));
    fact("invalidated_by_ctx_sync", p_ctx_sync());
    capture_status st = -1;
    MUST(p_is_capturing(s, &st));
    fact("invalidated_by_ctx_sync_status", st);
    fact("invalidated_ctx_sync_again", p_ctx_sync());
    graph_t g = NULL;
    fact("invalidated_ctx_sync_end", p_end(s, &g));
    if (g) SOFT(p_graph_destroy(g));
    fact("invalidated_ctx_sync_after_end", p_ctx_sync());
    SOFT(p_stream_destroy(s));
}

/* One cuMemUnmap over two adjacent mappings of different handles: the pool gives back a
 * stitched range of several handles with one call. */
static void unmap_two_mappings(void) {
    CUmemGenericAllocationHandle h1 = handle(1), h2 = handle(1);
    CUdeviceptr va = reserve(2);
    MUST(p_map(va, gran, 0, h1, 0));
    MUST(p_map(va + gran, gran, 0, h2, 0));
    MUST(p_set_access(va, 2 * gran, &rw, 1));
    CUresult r = p_unmap(va, 2 * gran);
    fact("unmap_over_two_mappings", r);
    if (r != CUDA_SUCCESS) {
        MUST(p_unmap(va, gran));
        MUST(p_unmap(va + gran, gran));
    }
    MUST(p_unreserve(va, 2 * gran));
    MUST(p_release(h1));
    MUST(p_release(h2));
}

/* A stream-ordered allocation and free on the legacy stream while a blocking stream captures
 * in relaxed mode (so the mode rules allow stream-ordered calls on other streams): work on the
 * legacy stream would make it wait for the capturing stream. */
static void legacy_beside_blocking_capture(void) {
    CUstream s;
    MUST(p_stream_create(&s, 0));
    for (int free_it = 0; free_it < 2; free_it++) {
        const char *what = free_it ? "legacy_free_async_beside_blocking_capture"
                                   : "legacy_alloc_async_beside_blocking_capture";
        char name[96];
        CUdeviceptr p = 0;
        if (free_it) {
            MUST(p_alloc_async(&p, gran, 0));
            MUST(p_stream_sync(0));
        }
        MUST(p_begin(s, 2));
        CUresult r = free_it ? p_free_async(p, 0) : p_alloc_async(&p, gran, 0);
        fact(what, r);
        capture_status st = -1;
        MUST(p_is_capturing(s, &st));
        snprintf(name, sizeof name, "%s_status", what);
        fact(name, st);
        graph_t g = NULL;
        snprintf(name, sizeof name, "%s_end", what);
        fact(name, p_end(s, &g));
        if (g) SOFT(p_graph_destroy(g));
        if (p && (free_it ? r != CUDA_SUCCESS : r == CUDA_SUCCESS)) SOFT(p_free_async(p, 0));
        SOFT(p_stream_sync(0));
    }
    SOFT(p_stream_destroy(s));
}

int main(void) {
    lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "driver_facts: no libcuda.so.1: %s\n", dlerror());
        return 2;
    }
    p_init = sym("cuInit");
    p_retain = sym("cuDevicePrimaryCtxRetain");
    p_set_current = sym("cuCtxSetCurrent");
    p_granularity = sym("cuMemGetAllocationGranularity");
    p_create = sym("cuMemCreate");
    p_release = sym("cuMemRelease");
    p_reserve = sym("cuMemAddressReserve");
    p_unreserve = sym("cuMemAddressFree");
    p_map = sym("cuMemMap");
    p_unmap = sym("cuMemUnmap");
    p_set_access = sym("cuMemSetAccess");
    p_htod = sym("cuMemcpyHtoD_v2");
    p_dtoh = sym("cuMemcpyDtoH_v2");
    p_alloc = sym("cuMemAlloc_v2");
    p_free = sym("cuMemFree_v2");
    p_alloc_async = sym("cuMemAllocAsync");
    p_free_async = sym("cuMemFreeAsync");
    p_stream_create = sym("cuStreamCreate");
    p_stream_destroy = sym("cuStreamDestroy_v2");
    p_stream_sync = sym("cuStreamSynchronize");
    p_begin = sym("cuStreamBeginCapture_v2");
    p_end = sym("cuStreamEndCapture");
    p_is_capturing = sym("cuStreamIsCapturing");
    p_event_create = sym("cuEventCreate");
    p_event_record = sym("cuEventRecord");
    p_event_destroy = sym("cuEventDestroy_v2");
    p_wait_event = sym("cuStreamWaitEvent");
    p_graph_destroy = sym("cuGraphDestroy");
    p_ctx_sync = sym("cuCtxSynchronize");
    p_mem_get_info = sym("cuMemGetInfo_v2");
    p_event_query = sym("cuEventQuery");
    p_event_sync = sym("cuEventSynchronize");
    p_stream_query = sym("cuStreamQuery");
    p_default_pool = sym("cuDeviceGetDefaultMemPool");
    p_pool_trim = sym("cuMemPoolTrimTo");

    MUST(p_init(0));
    MUST(p_retain(&ctx, 0));
    MUST(p_set_current(ctx));
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    rw.location = prop.location;
    rw.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    MUST(p_granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    fact("granularity", (long)gran);

    map_at_offset();
    map_twice();
    access_and_unmap();
    frees_in_capture();
    joined_stream();
    unjoined_fork();
    merge_wait();
    calls_in_capture();
    ended_capture_event();
    ctx_sync_while_invalidated();
    unmap_two_mappings();
    legacy_beside_blocking_capture();
    printf("driver_facts: done\n");
    return 0;
}
