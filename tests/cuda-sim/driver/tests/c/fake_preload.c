/* A stand-in interposer exporting driver symbols: the simulated driver must still hand out
 * its own addresses through cuGetProcAddress, as the real one does. */
int cuMemAlloc_v2(unsigned long long *p, unsigned long n) { (void)p; (void)n; return 77; }
int cuMemFree_v2(unsigned long long p) { (void)p; return 77; }
int cuMemAllocAsync_ptsz(unsigned long long *p, unsigned long n, void *s) { (void)p; (void)n; (void)s; return 77; }
int cuGetProcAddress_v2(const char *s, void **f, int v, unsigned long long fl, int *st) {
    (void)s; (void)f; (void)v; (void)fl; (void)st; return 77;
}
