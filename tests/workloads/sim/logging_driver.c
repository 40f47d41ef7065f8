/* logging_driver.c: a stand-in libcuda.so.1 exporting ONLY cuGetProcAddress_v2. It logs every
 * lookup to stderr as "lookup NAME VERSION FLAGS" and answers with the real (simulated) driver
 * at $VRAMSIM_REAL_LIBCUDA. A runtime that works through it reaches the driver through
 * cuGetProcAddress_v2 alone. Build: gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -ldl. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cuda_api.h"

static PFN_cuGetProcAddress_v2 real;

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status) {
    if (!real) {
        const char *path = getenv("VRAMSIM_REAL_LIBCUDA");
        void *h = path ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : NULL;
        real = h ? (PFN_cuGetProcAddress_v2)dlsym(h, "cuGetProcAddress_v2") : NULL;
        if (!real) {
            fprintf(stderr, "logging_driver: cannot load VRAMSIM_REAL_LIBCUDA=%s\n", path ? path : "(unset)");
            return CUDA_ERROR_NOT_INITIALIZED;
        }
    }
    fprintf(stderr, "lookup %s %d %llu\n", symbol ? symbol : "(null)", cudaVersion, (unsigned long long)flags);
    CUresult rc = real(symbol, pfn, cudaVersion, flags, status);
    /* a lookup of cuGetProcAddress itself must keep callers on this function */
    if (rc == CUDA_SUCCESS && symbol && pfn && *pfn && (!strncmp(symbol, "cuGetProcAddress", 16)))
        *pfn = (void *)cuGetProcAddress_v2;
    return rc;
}
