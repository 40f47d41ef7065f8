/* trace_loop [N]: allocates and frees 4096 + i bytes forever (or N times), one pair every
 * ~1 ms, printing "ready" after the first pair. The SIGKILL test kills it mid-run. */
#include <time.h>
#include <unistd.h>
#include "check.h"

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : -1;
    CK(cudaSetDevice(0));
    for (long i = 0; n < 0 || i < n; i++) {
        void *p = 0;
        CK(cudaMalloc(&p, 4096 + (size_t)(i % 1000)));
        CK(cudaFree(p));
        if (i == 0) {
            printf("ready\n");
            fflush(stdout);
        }
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, 0);
    }
    return 0;
}
