/* fork_in_setup: a fork while another thread is inside the cap's set-up.
 *
 * Run under the preload with VRAMSHIM_CAP=64MiB and VRAMSHIM_CAP_FAULT=setup-pause (the set-up
 * of this process writes one line to stderr, then pauses for two minutes). A worker thread
 * makes the first cudaMalloc and so enters the set-up; the main thread reads stderr (a pipe
 * of its own) until the pause's line says the worker is in there, then forks. The child,
 * where the worker does not exist, makes capped cudaMallocs: 1 MiB (whatever the simulated
 * driver answers a child forked after CUDA was touched), then 128 MiB, which the cap must
 * refuse. A child that waits for the parent's set-up never returns from its first call.
 * Prints "child exit=N"; the parent leaves with _exit while the worker is still paused. */
#include <poll.h>
#include <pthread.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"
#include "vs.h"

static void *worker(void *arg) {
    (void)arg;
    void *p = NULL;
    (void)cudaMalloc(&p, 1 << 20);
    return NULL;
}

/* Reads `fd` until `needle` was seen; 0 on success, -1 after `limit_ms` or at end of file. */
static int wait_for_line(int fd, const char *needle, int limit_ms) {
    char buf[8192];
    size_t len = 0;
    for (int waited = 0; waited < limit_ms; waited += 100) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (poll(&pfd, 1, 100) <= 0) continue;
        ssize_t n = read(fd, buf + len, sizeof buf - 1 - len);
        if (n <= 0) return -1;
        len += (size_t)n;
        buf[len] = 0;
        if (strstr(buf, needle)) return 0;
        if (len > sizeof buf / 2) { /* keep the tail: the needle may straddle a read */
            memmove(buf, buf + len - 256, 256);
            len = 256;
        }
    }
    return -1;
}

static int child(void) {
    void *a = NULL, *b = NULL;
    cudaError_t small = cudaMalloc(&a, 1 << 20);
    cudaError_t big = cudaMalloc(&b, 128u << 20);
    printf("child: small=%d big=%d cap_refusals=%lld\n", (int)small, (int)big, VS("cap_refusals"));
    fflush(stdout);
    if (small == cudaSuccess) cudaFree(a);
    return big == cudaErrorMemoryAllocation && VS("cap_refusals") == 1 ? 0 : 1;
}

int main(void) {
    if (!vs_init()) {
        fprintf(stderr, "fork_in_setup: run it under the preload\n");
        return 2;
    }
    int p[2];
    EXPECT(pipe(p) == 0);
    int saved = dup(2);
    EXPECT(saved >= 0 && dup2(p[1], 2) == 2);
    pthread_t t;
    EXPECT(pthread_create(&t, NULL, worker, NULL) == 0);
    int seen = wait_for_line(p[0], "VRAMSHIM_CAP_FAULT=setup-pause", 60000);
    EXPECT(dup2(saved, 2) == 2);
    if (seen != 0) {
        fprintf(stderr, "fork_in_setup: the set-up's pause line did not come\n");
        return 2;
    }
    fflush(stdout);
    pid_t pid = fork();
    EXPECT(pid >= 0);
    if (pid == 0) _exit(child());
    int st = 0;
    EXPECT(waitpid(pid, &st, 0) == pid);
    printf("child exit=%d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    fflush(stdout);
    _exit(0);
}
