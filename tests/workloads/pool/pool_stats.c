/*
 * pool_stats - read the pool's own statistics in-process (vramshim_pool_stats and
 * vramshim_pool_stat, found with dlsym) while blocks are live, after they are freed, and
 * after a device synchronization.
 *
 *   pool_stats
 *
 * Allocates three blocks (5 MiB, 3 MiB + 512 B, 7 MiB) with cudaMalloc, prints the stats,
 * frees them with cudaFree, synchronizes the device, prints them again.
 * Output: "pool_stats: no library" when libvramshim.so is not loaded, "pool_stats: no pool"
 * when device 0 has no pool, else two lines "pool_stats STAGE n=N reserved=.. live=..
 * cached=.. pending=.. budget=.. recent_peak_live=.. releases=.. byname_reserved=.."
 * (STAGE: live, freed). Exit 0, or 2 on a CUDA error.
 */
#include <stdint.h>

#define PROG "pool_stats"
#include "pool_workload.h"

typedef int (*stats_fn)(int, uint64_t *, size_t);

static void show(const char *stage, stats_fn f, stat_fn g) {
    uint64_t v[64];
    int n = f(0, v, 64);
    if (n < 0) {
        printf("pool_stats: no pool\n");
        return;
    }
    printf("pool_stats %s n=%d reserved=%llu live=%llu cached=%llu pending=%llu budget=%llu "
           "recent_peak_live=%llu releases=%llu byname_reserved=%lld unknown=%lld\n",
           stage, n, (unsigned long long)v[0], (unsigned long long)v[1],
           (unsigned long long)v[2], (unsigned long long)v[3], (unsigned long long)v[4],
           (unsigned long long)v[5], (unsigned long long)v[6], g(0, "reserved"),
           g(0, "no-such-field"));
}

int main(void) {
    stats_fn f = (stats_fn)dlsym(RTLD_DEFAULT, "vramshim_pool_stats");
    stat_fn g = (stat_fn)dlsym(RTLD_DEFAULT, "vramshim_pool_stat");
    if (!f || !g) {
        printf("pool_stats: no library\n");
        return 0;
    }
    size_t sizes[3] = {5u << 20, (3u << 20) + 512, 7u << 20};
    void *p[3];
    for (int i = 0; i < 3; i++) CHECK(cudaMalloc(&p[i], sizes[i]));
    show("live", f, g);
    for (int i = 0; i < 3; i++) CHECK(cudaFree(p[i]));
    CHECK(cudaDeviceSynchronize());
    show("freed", f, g);
    return 0;
}
