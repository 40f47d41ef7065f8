/*
 * replay - replays an allocation log in RMM's CSV format through real CUDA calls.
 *
 *   replay [options] LOG.csv
 *
 * LOG.csv: RMM logging_resource_adaptor format, header `Thread,Time,Action,Pointer,Size,Stream`
 * (columns found by name), Action `allocate` | `free` | `allocate failure` (skipped).
 * Every `allocate` becomes cudaMalloc(Size); every `free` of a pointer allocated earlier in
 * the log becomes cudaFree of the block that allocation returned. Frees of pointers the log
 * never allocated (allocated before recording started, or whose allocation failed here) are
 * skipped and counted.
 *
 * Options:
 *   --async            cudaMallocAsync / cudaFreeAsync on one non-blocking stream
 *   --driver           cuMemAlloc_v2 / cuMemFree_v2 from dlopen("libcuda.so.1") + dlsym
 *                      (primary context retained and made current; no runtime calls)
 *   --pattern MODE     none (default) | memset | memcpy: write a per-block pattern after each
 *                      allocation (memset: whole block; memcpy: head and tail 4 KiB) and check
 *                      head, middle and tail before the free; a mismatch is reported and the
 *                      exit status is 1
 *   --device N         device to use (default 0)
 *   --limit N          replay only the first N rows
 *   --repeat N         replay the log N times (each repetition frees what it left live)
 *   --stop-on-failure  stop at the first failed allocation
 *   --sync-every N     cudaDeviceSynchronize (cuCtxSynchronize) every N rows
 *   --no-cleanup       leave blocks live at the end allocated (the process exit frees them)
 *   --quiet            no per-failure lines on stderr
 *
 * Output: stderr gets one line for each of the first 5 failures:
 *   replay: event I: alloc SIZE failed: CODE (NAME)
 * and stdout ends with exactly one summary line (keys stable, values decimal):
 *   replay: events=N allocs=N frees=N failed=N first_failure=I peak_live=BYTES
 *           skipped_frees=N live_at_end=N mismatches=N ns=WALL_NS
 * (one line; first_failure is the 0-based row index of the first failed allocation, -1 if
 * none; with --repeat, I counts rows across repetitions.)
 *
 * Keep this file self-contained apart from "cuda_api.h": `vramshim demo` embeds both files
 * (include_str!) and compiles them with cc at run time.
 *
 * Exit status: 0 every allocation succeeded and every pattern matched; 2 some allocation
 * failed (out of memory or another CUDA error, see failed= and stderr); 1 a pattern mismatch,
 * a failed free/copy, or bad input (message on stderr).
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_api.h"

#define WINDOW 4096

/* ------------------------------------------------------------------ options, state */

enum pattern { PAT_NONE, PAT_MEMSET, PAT_MEMCPY };

static int opt_async, opt_driver, opt_stop, opt_quiet, opt_no_cleanup, opt_device;
static enum pattern opt_pattern = PAT_NONE;
static long long opt_limit = -1, opt_repeat = 1, opt_sync_every = 0;

static cudaStream_t stream;

static struct {
    CUresult (*init)(unsigned);
    CUresult (*retain)(CUcontext *, CUdevice);
    CUresult (*set_current)(CUcontext);
    CUresult (*alloc)(CUdeviceptr *, size_t);
    CUresult (*free)(CUdeviceptr);
    CUresult (*memset8)(CUdeviceptr, unsigned char, size_t);
    CUresult (*htod)(CUdeviceptr, const void *, size_t);
    CUresult (*dtoh)(void *, CUdeviceptr, size_t);
    CUresult (*sync)(void);
    CUresult (*err_name)(CUresult, const char **);
} drv;

struct event {
    int is_alloc;
    uint64_t ptr; /* pointer in the log */
    size_t size;
};

struct block {
    uint64_t key; /* log pointer; 0 = empty slot, 1 = tombstone */
    void *dev;
    size_t size;
    long long born; /* row index of the allocation */
};

static struct block *table;
static size_t table_cap, table_used;

static unsigned long long n_allocs, n_frees, n_failed, n_skipped, n_mismatch, live_bytes, peak_live;
static long long first_failure = -1;

static void die(const char *msg, const char *arg) {
    fprintf(stderr, "replay: %s%s%s\n", msg, arg ? ": " : "", arg ? arg : "");
    exit(1);
}

/* ------------------------------------------------------------------------- hash map */

static uint64_t mix(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return k;
}

static struct block *lookup(uint64_t key, int insert) {
    if (insert && (table_used + 1) * 2 > table_cap) {
        size_t old_cap = table_cap;
        struct block *old = table;
        table_cap = table_cap ? table_cap * 2 : 1024;
        table = calloc(table_cap, sizeof *table);
        if (!table) die("out of host memory", NULL);
        table_used = 0;
        for (size_t i = 0; i < old_cap; i++)
            if (old[i].key > 1) {
                struct block *b = lookup(old[i].key, 1);
                *b = old[i];
            }
        free(old);
    }
    if (!table_cap) return NULL;
    size_t i = mix(key) & (table_cap - 1);
    struct block *tomb = NULL;
    for (;;) {
        struct block *b = &table[i];
        if (b->key == key) return b;
        if (b->key == 0) {
            if (!insert) return NULL;
            if (tomb) b = tomb;
            else table_used++;
            b->key = key;
            return b;
        }
        if (b->key == 1 && !tomb) tomb = b;
        i = (i + 1) & (table_cap - 1);
    }
}

/* ------------------------------------------------------------------------ CSV parse */

static struct event *events;
static size_t n_events, cap_events;

static int split(char *line, char **cols, int max) {
    int n = 0;
    char *p = line;
    while (n < max) {
        cols[n++] = p;
        char *c = strchr(p, ',');
        if (!c) break;
        *c = 0;
        p = c + 1;
    }
    for (int i = 0; i < n; i++) {
        char *e = cols[i] + strlen(cols[i]);
        while (e > cols[i] && isspace((unsigned char)e[-1])) *--e = 0;
        while (isspace((unsigned char)*cols[i])) cols[i]++;
    }
    return n;
}

static void load(const char *path) {
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "r");
    if (!f) die(strerror(errno), path);
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int c_action = -1, c_ptr = -1, c_size = -1, ncols = 0;
    long long lineno = 0;
    while ((len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        char *cols[16];
        int n = split(line, cols, 16);
        if (n == 1 && cols[0][0] == 0) continue;
        if (c_action < 0) {
            for (int i = 0; i < n; i++) {
                if (strcmp(cols[i], "Action") == 0) c_action = i;
                if (strcmp(cols[i], "Pointer") == 0) c_ptr = i;
                if (strcmp(cols[i], "Size") == 0) c_size = i;
            }
            if (c_action < 0 || c_ptr < 0 || c_size < 0)
                die("not an RMM log: the header lacks Action, Pointer or Size", path);
            ncols = n;
            continue;
        }
        if (n < ncols) {
            fprintf(stderr, "replay: %s:%lld: expected %d columns, found %d\n", path, lineno, ncols, n);
            exit(1);
        }
        struct event ev;
        if (strcmp(cols[c_action], "allocate") == 0) ev.is_alloc = 1;
        else if (strcmp(cols[c_action], "free") == 0) ev.is_alloc = 0;
        else if (strcmp(cols[c_action], "allocate failure") == 0) continue;
        else {
            fprintf(stderr, "replay: %s:%lld: unknown action '%s'\n", path, lineno, cols[c_action]);
            exit(1);
        }
        char *end;
        errno = 0;
        ev.ptr = strcmp(cols[c_ptr], "(nil)") == 0 ? 0 : strtoull(cols[c_ptr], &end, 16);
        if (errno) {
            fprintf(stderr, "replay: %s:%lld: bad pointer '%s'\n", path, lineno, cols[c_ptr]);
            exit(1);
        }
        ev.size = strtoull(cols[c_size], &end, 10);
        if (*end || cols[c_size][0] == 0 || cols[c_size][0] == '-') {
            fprintf(stderr, "replay: %s:%lld: bad size '%s'\n", path, lineno, cols[c_size]);
            exit(1);
        }
        if (ev.ptr <= 1) continue; /* a NULL pointer cannot be tracked */
        if (n_events == cap_events) {
            cap_events = cap_events ? cap_events * 2 : 4096;
            events = realloc(events, cap_events * sizeof *events);
            if (!events) die("out of host memory", NULL);
        }
        events[n_events++] = ev;
        if (opt_limit >= 0 && (long long)n_events >= opt_limit) break;
    }
    free(line);
    if (f != stdin) fclose(f);
    if (c_action < 0) die("empty log", path);
}

/* ---------------------------------------------------------------------- CUDA calls */

static const char *errname(int rc) {
    if (opt_driver) {
        const char *s = "?";
        if (drv.err_name) drv.err_name((CUresult)rc, &s);
        return s;
    }
    return cudaGetErrorName((cudaError_t)rc);
}

static void setup(void) {
    if (opt_driver) {
        void *h = dlopen("libcuda.so.1", RTLD_NOW);
        if (!h) die("cannot load libcuda.so.1", dlerror());
#define SYM(field, name)                                                                   \
    do {                                                                                   \
        *(void **)&drv.field = dlsym(h, name);                                             \
        if (!drv.field) die("libcuda.so.1 lacks", name);                                   \
    } while (0)
        SYM(init, "cuInit");
        SYM(retain, "cuDevicePrimaryCtxRetain");
        SYM(set_current, "cuCtxSetCurrent");
        SYM(alloc, "cuMemAlloc_v2");
        SYM(free, "cuMemFree_v2");
        SYM(memset8, "cuMemsetD8_v2");
        SYM(htod, "cuMemcpyHtoD_v2");
        SYM(dtoh, "cuMemcpyDtoH_v2");
        SYM(sync, "cuCtxSynchronize");
        *(void **)&drv.err_name = dlsym(h, "cuGetErrorName");
        CUcontext ctx;
        int rc;
        if ((rc = drv.init(0)) != CUDA_SUCCESS || (rc = drv.retain(&ctx, opt_device)) != CUDA_SUCCESS ||
            (rc = drv.set_current(ctx)) != CUDA_SUCCESS) {
            fprintf(stderr, "replay: driver setup failed: %d (%s)\n", rc, errname(rc));
            exit(1);
        }
        return;
    }
    int rc = cudaSetDevice(opt_device);
    if (rc == cudaSuccess && opt_async) rc = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    if (rc != cudaSuccess) {
        fprintf(stderr, "replay: CUDA setup failed: %d (%s)\n", rc, errname(rc));
        exit(1);
    }
}

static int dev_alloc(void **p, size_t size) {
    if (opt_driver) {
        CUdeviceptr d = 0;
        int rc = drv.alloc(&d, size);
        *p = (void *)(uintptr_t)d;
        return rc;
    }
    return opt_async ? cudaMallocAsync(p, size, stream) : cudaMalloc(p, size);
}

static int dev_free(void *p) {
    if (opt_driver) return drv.free((CUdeviceptr)(uintptr_t)p);
    return opt_async ? cudaFreeAsync(p, stream) : cudaFree(p);
}

static int dev_sync(void) {
    if (opt_driver) return drv.sync();
    return cudaDeviceSynchronize();
}

static int dev_memset(void *p, unsigned char v, size_t n) {
    if (opt_driver) return drv.memset8((CUdeviceptr)(uintptr_t)p, v, n);
    return opt_async ? cudaMemsetAsync(p, v, n, stream) : cudaMemset(p, v, n);
}

static int dev_write(void *dst, const void *src, size_t n) {
    if (opt_driver) return drv.htod((CUdeviceptr)(uintptr_t)dst, src, n);
    return opt_async ? cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, stream)
                     : cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice);
}

static int dev_read(void *dst, const void *src, size_t n) {
    if (opt_driver) return drv.dtoh(dst, (CUdeviceptr)(uintptr_t)src, n);
    if (opt_async) {
        int rc = cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, stream);
        return rc ? rc : cudaStreamSynchronize(stream);
    }
    return cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost);
}

static void fail_io(const char *what, long long idx, int rc) {
    fprintf(stderr, "replay: event %lld: %s failed: %d (%s)\n", idx, what, rc, errname(rc));
    exit(1);
}

/* ------------------------------------------------------------------------ patterns */

static unsigned char seed_byte(long long born) { return (unsigned char)(born * 131 + 17) | 1; }

static void fill_words(unsigned char *buf, size_t n, long long born, size_t offset) {
    for (size_t i = 0; i < n; i++) buf[i] = (unsigned char)((born * 2654435761u) >> ((offset + i) % 24)) ^ (unsigned char)(offset + i);
}

static void write_pattern(struct block *b, long long idx) {
    static unsigned char buf[WINDOW];
    int rc;
    if (opt_pattern == PAT_MEMSET) {
        if ((rc = dev_memset(b->dev, seed_byte(b->born), b->size))) fail_io("memset", idx, rc);
    } else if (opt_pattern == PAT_MEMCPY) {
        size_t head = b->size < WINDOW ? b->size : WINDOW;
        fill_words(buf, head, b->born, 0);
        if ((rc = dev_write(b->dev, buf, head))) fail_io("memcpy", idx, rc);
        if (b->size > WINDOW) {
            size_t tail_off = b->size - WINDOW > WINDOW ? b->size - WINDOW : WINDOW;
            size_t tail = b->size - tail_off;
            static unsigned char tbuf[WINDOW];
            fill_words(tbuf, tail, b->born, tail_off);
            if ((rc = dev_write((char *)b->dev + tail_off, tbuf, tail))) fail_io("memcpy", idx, rc);
        }
        /* the host buffers are reused: wait until the stream has read them */
        if (opt_async && (rc = cudaStreamSynchronize(stream))) fail_io("sync", idx, rc);
    }
}

static int check_window(struct block *b, size_t off, size_t n, long long idx) {
    static unsigned char got[WINDOW], want[WINDOW];
    int rc = dev_read(got, (char *)b->dev + off, n);
    if (rc) fail_io("memcpy (check)", idx, rc);
    if (opt_pattern == PAT_MEMSET) memset(want, seed_byte(b->born), n);
    else fill_words(want, n, b->born, off);
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i]) {
            fprintf(stderr, "replay: event %lld: pattern mismatch in the block of event %lld (size %zu) at offset %zu: 0x%02x, expected 0x%02x\n",
                    idx, b->born, b->size, off + i, got[i], want[i]);
            return 1;
        }
    return 0;
}

static void check_pattern(struct block *b, long long idx) {
    if (opt_pattern == PAT_NONE || b->size == 0) return;
    size_t head = b->size < WINDOW ? b->size : WINDOW;
    int bad = check_window(b, 0, head, idx);
    if (b->size > WINDOW) {
        size_t tail_off = b->size - WINDOW > WINDOW ? b->size - WINDOW : WINDOW;
        bad |= check_window(b, tail_off, b->size - tail_off, idx);
        if (opt_pattern == PAT_MEMSET && b->size > 3 * WINDOW)
            bad |= check_window(b, (b->size / 2) & ~(size_t)63, WINDOW, idx);
    }
    n_mismatch += bad;
}

/* Frees every block still live (end of a repetition, or of the run). */
static void free_all_live(long long row) {
    for (size_t i = 0; i < table_cap; i++)
        if (table[i].key > 1) {
            int rc = dev_free(table[i].dev);
            if (rc) fail_io("free", row, rc);
            live_bytes -= table[i].size;
            table[i].key = 1;
        }
}

/* ---------------------------------------------------------------------------- main */

static long long arg_num(const char *opt, const char *v) {
    if (!v) die("missing value for", opt);
    char *end;
    long long n = strtoll(v, &end, 10);
    if (*end || n < 0) die("expected a non-negative number for", opt);
    return n;
}

int main(int argc, char **argv) {
    const char *path = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--async")) opt_async = 1;
        else if (!strcmp(a, "--driver")) opt_driver = 1;
        else if (!strcmp(a, "--stop-on-failure")) opt_stop = 1;
        else if (!strcmp(a, "--quiet")) opt_quiet = 1;
        else if (!strcmp(a, "--no-cleanup")) opt_no_cleanup = 1;
        else if (!strcmp(a, "--device")) opt_device = (int)arg_num(a, i + 1 < argc ? argv[++i] : NULL);
        else if (!strcmp(a, "--limit")) opt_limit = arg_num(a, i + 1 < argc ? argv[++i] : NULL);
        else if (!strcmp(a, "--repeat")) opt_repeat = arg_num(a, i + 1 < argc ? argv[++i] : NULL);
        else if (!strcmp(a, "--sync-every")) opt_sync_every = arg_num(a, i + 1 < argc ? argv[++i] : NULL);
        else if (!strcmp(a, "--pattern")) {
            const char *m = i + 1 < argc ? argv[++i] : "";
            if (!strcmp(m, "none")) opt_pattern = PAT_NONE;
            else if (!strcmp(m, "memset")) opt_pattern = PAT_MEMSET;
            else if (!strcmp(m, "memcpy")) opt_pattern = PAT_MEMCPY;
            else die("--pattern takes none, memset or memcpy, not", m);
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: replay [--async|--driver] [--pattern none|memset|memcpy] [--device N] [--limit N]\n"
                   "              [--repeat N] [--sync-every N] [--stop-on-failure] [--no-cleanup] [--quiet] LOG.csv\n");
            return 0;
        } else if (a[0] == '-' && a[1]) die("unknown option", a);
        else if (path) die("more than one log given", a);
        else path = a;
    }
    if (!path) die("usage: replay [options] LOG.csv (see --help)", NULL);
    if (opt_async && opt_driver) die("--async and --driver exclude each other", NULL);
    load(path);
    setup();

    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    long long row = 0;
    int stopped = 0;
    for (long long rep = 0; rep < opt_repeat && !stopped; rep++) {
        for (size_t i = 0; i < n_events; i++, row++) {
            struct event *ev = &events[i];
            if (ev->is_alloc) {
                struct block *old = lookup(ev->ptr, 0);
                if (old) { /* the log reuses a live pointer: drop the stale block */
                    check_pattern(old, row);
                    int rc = dev_free(old->dev);
                    if (rc) fail_io("free", row, rc);
                    live_bytes -= old->size;
                    old->key = 1;
                }
                void *p = NULL;
                int rc = dev_alloc(&p, ev->size);
                if (rc != 0) {
                    n_failed++;
                    if (first_failure < 0) first_failure = row;
                    if (!opt_quiet && n_failed <= 5)
                        fprintf(stderr, "replay: event %lld: alloc %zu failed: %d (%s)\n", row, ev->size, rc, errname(rc));
                    if (!opt_driver) (void)cudaGetLastError();
                    if (opt_stop) { stopped = 1; break; }
                    continue;
                }
                n_allocs++;
                struct block *b = lookup(ev->ptr, 1);
                b->dev = p;
                b->size = ev->size;
                b->born = row;
                live_bytes += ev->size;
                if (live_bytes > peak_live) peak_live = live_bytes;
                write_pattern(b, row);
            } else {
                struct block *b = lookup(ev->ptr, 0);
                if (!b) { n_skipped++; continue; }
                check_pattern(b, row);
                int rc = dev_free(b->dev);
                if (rc) fail_io("free", row, rc);
                n_frees++;
                live_bytes -= b->size;
                b->key = 1;
            }
            if (opt_sync_every && (row + 1) % opt_sync_every == 0) {
                int rc = dev_sync();
                if (rc) fail_io("synchronize", row, rc);
            }
        }
        if (rep + 1 < opt_repeat) free_all_live(row);
    }
    unsigned long long live_at_end = 0;
    for (size_t i = 0; i < table_cap; i++)
        if (table[i].key > 1) live_at_end++;
    int rc = dev_sync();
    if (rc) fail_io("synchronize", row, rc);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (!opt_no_cleanup) free_all_live(row);
    unsigned long long ns = (unsigned long long)(t1.tv_sec - t0.tv_sec) * 1000000000ull + (t1.tv_nsec - t0.tv_nsec);
    printf("replay: events=%lld allocs=%llu frees=%llu failed=%llu first_failure=%lld peak_live=%llu "
           "skipped_frees=%llu live_at_end=%llu mismatches=%llu ns=%llu\n",
           row, n_allocs, n_frees, n_failed, first_failure, peak_live, n_skipped, live_at_end, n_mismatch, ns);
    fflush(stdout);
    if (n_mismatch) return 1;
    return n_failed ? 2 : 0;
}
