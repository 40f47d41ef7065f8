/* trace_exit_signal MODE N US: N cudaMalloc/cudaFree pairs of 4096 + i bytes, then a SIGALRM
 * after US microseconds whose handler calls _exit(3) (async-signal-safe); until it comes
 *   malloc -> the main thread allocates and frees host memory in a loop (sizes from 16 bytes
 *             to 96 KiB, 64 kept at a time), so the signal lands inside malloc or free, with
 *             the allocator's lock held, nearly every time;
 *   pause  -> the main thread waits in pause() (the signal interrupts nothing of the
 *             allocator's: the trace can be finished).
 * Prints nothing: the test reads the exit status and the trace. */
#include <signal.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>
#include "check.h"

static void on_alarm(int sig) {
    (void)sig;
    _exit(3);
}

int main(int argc, char **argv) {
    if (argc < 4) return 2;
    const char *mode = argv[1];
    long n = atol(argv[2]);
    long us = atol(argv[3]);
    CK(cudaSetDevice(0));
    for (long i = 0; i < n; i++) {
        void *p = 0;
        CK(cudaMalloc(&p, 4096 + (size_t)i));
        CK(cudaFree(p));
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGALRM, &sa, 0) != 0) return 1;
    struct itimerval it;
    memset(&it, 0, sizeof it);
    it.it_value.tv_sec = us / 1000000;
    it.it_value.tv_usec = us % 1000000;
    if (setitimer(ITIMER_REAL, &it, 0) != 0) return 1;
    if (strcmp(mode, "pause") == 0) {
        for (;;) pause();
    }
    if (strcmp(mode, "malloc") != 0) return 2;
    void *kept[64] = {0};
    unsigned x = 12345;
    for (;;) {
        x = x * 1103515245u + 12345u;
        unsigned k = (x >> 8) % 64;
        free(kept[k]);
        size_t size = 16 + (x >> 12) % (96 * 1024);
        kept[k] = malloc(size);
        if (!kept[k]) return 1;
        ((volatile char *)kept[k])[0] = 1;
    }
}
