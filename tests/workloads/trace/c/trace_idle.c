/* trace_idle SECONDS [PERIOD_US]: one cudaMalloc (the trace starts), then SECONDS seconds of
 * sleeping; with PERIOD_US > 0, one cudaDeviceSynchronize (one traced Sync event) every
 * PERIOD_US microseconds, as a training loop closing each step. `scripts/bench writer` runs it
 * traced under callgrind for two durations: the difference is the trace writer thread's cost
 * per second of wall time, idle or with a few events per tick. */
#include <time.h>
#include "check.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: trace_idle SECONDS [PERIOD_US]\n");
        return 2;
    }
    double secs = atof(argv[1]);
    long period = argc > 2 ? atol(argv[2]) : 0;
    void *p = 0;
    CK(cudaSetDevice(0));
    CK(cudaMalloc(&p, 1 << 20));
    double end = now_s() + secs;
    long syncs = 0;
    while (now_s() < end) {
        double left = end - now_s();
        double step = period > 0 ? (double)period / 1e6 : left;
        if (step > left) step = left;
        struct timespec d = {(time_t)step, (long)((step - (double)(time_t)step) * 1e9)};
        nanosleep(&d, NULL);
        if (period > 0) {
            CK(cudaDeviceSynchronize());
            syncs++;
        }
    }
    CK(cudaFree(p));
    printf("syncs %ld\n", syncs);
    return 0;
}
