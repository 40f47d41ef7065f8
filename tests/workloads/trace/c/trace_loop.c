/* trace_loop [N]: allocates and frees 4096 + i bytes forever (or N times), one pair every
 * ~1 ms, printing "ready" after the first pair. The SIGKILL test kills it mid-run.
 * With TRACE_LOOP_PROGRESS=FILE, the CLOCK_MONOTONIC time (ns) at which the last pair
 * returned is kept in FILE's first 8 bytes (a shared mapping: it survives the SIGKILL), so
 * the test can tell what the tracer lost from what the program simply had not done yet. */
#include <fcntl.h>
#include <stdint.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include "check.h"

static volatile uint64_t *progress_map(void) {
    const char *path = getenv("TRACE_LOOP_PROGRESS");
    if (!path) return NULL;
    int fd = open(path, O_RDWR | O_CREAT, 0600);
    if (fd < 0 || ftruncate(fd, 8) != 0) return NULL;
    void *p = mmap(NULL, 8, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    return p == MAP_FAILED ? NULL : (volatile uint64_t *)p;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : -1;
    volatile uint64_t *progress = progress_map();
    CK(cudaSetDevice(0));
    for (long i = 0; n < 0 || i < n; i++) {
        void *p = 0;
        CK(cudaMalloc(&p, 4096 + (size_t)(i % 1000)));
        CK(cudaFree(p));
        if (progress) {
            struct timespec now;
            clock_gettime(CLOCK_MONOTONIC, &now);
            *progress = (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
        }
        if (i == 0) {
            printf("ready\n");
            fflush(stdout);
        }
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, 0);
    }
    return 0;
}
