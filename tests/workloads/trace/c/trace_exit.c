/* trace_exit MODE N: N cudaMalloc/cudaFree pairs of 4096 + i bytes, then
 *   _exit  -> _exit(0) at once (no atexit handlers run)
 *   _Exit  -> _Exit(0) at once
 *   vfork  -> vfork(); the child calls _exit(0) at once; the parent then makes N more pairs
 *             and returns from main.
 * Prints nothing: the test reads the trace. */
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"

static void pairs(long n, long from) {
    for (long i = from; i < from + n; i++) {
        void *p = 0;
        CK(cudaMalloc(&p, 4096 + (size_t)i));
        CK(cudaFree(p));
    }
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    const char *mode = argv[1];
    long n = atol(argv[2]);
    CK(cudaSetDevice(0));
    pairs(n, 0);
    if (strcmp(mode, "_exit") == 0) _exit(0);
    if (strcmp(mode, "_Exit") == 0) _Exit(0);
    if (strcmp(mode, "vfork") == 0) {
        pid_t pid = vfork();
        if (pid < 0) return 1;
        if (pid == 0) _exit(0);
        int st = 0;
        waitpid(pid, &st, 0);
        pairs(n, n);
        return 0;
    }
    return 2;
}
