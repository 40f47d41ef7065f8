/* nvml_reorder: a libnvidia-ml.so.1 that shows the simulated GPUs in the reverse order, as
 * NVML does on a machine where CUDA_VISIBLE_DEVICES (or CUDA_DEVICE_ORDER) makes CUDA's
 * ordinals differ from NVML's indices: NVML index i is CUDA device n-1-i. Forwards to the
 * simulated library named by VRAMSIM_REAL_NVML; handles and PCI bus ids pass unchanged.
 * Build: gcc -shared -fPIC -Wl,-soname,libnvidia-ml.so.1 -o DIR/libnvidia-ml.so.1 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include "check.h"

static void *real(const char *name) {
    static void *h;
    if (!h) {
        const char *path = getenv("VRAMSIM_REAL_NVML");
        h = path ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : NULL;
        if (!h) {
            fprintf(stderr, "nvml_reorder: cannot open VRAMSIM_REAL_NVML=%s\n", path ? path : "(unset)");
            exit(4);
        }
    }
    /* glibc's own dlsym, not the global one: under the preload, dlsym answers vramshim's
     * hooks for NVML names, which would call back into this library. */
    static void *(*libc_dlsym)(void *, const char *);
    if (!libc_dlsym) libc_dlsym = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!libc_dlsym) libc_dlsym = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    void *f = libc_dlsym ? libc_dlsym(h, name) : NULL;
    if (!f) {
        fprintf(stderr, "nvml_reorder: %s missing\n", name);
        exit(4);
    }
    return f;
}

static unsigned count(void) {
    unsigned n = 0;
    ((nvmlReturn_t(*)(unsigned *))real("nvmlDeviceGetCount_v2"))(&n);
    return n;
}

nvmlReturn_t nvmlInit_v2(void) { return ((nvmlReturn_t(*)(void))real("nvmlInit_v2"))(); }
nvmlReturn_t nvmlShutdown(void) { return ((nvmlReturn_t(*)(void))real("nvmlShutdown"))(); }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *n) {
    return ((nvmlReturn_t(*)(unsigned *))real("nvmlDeviceGetCount_v2"))(n);
}
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned i, nvmlDevice_t *d) {
    unsigned n = count();
    return ((nvmlReturn_t(*)(unsigned, nvmlDevice_t *))real("nvmlDeviceGetHandleByIndex_v2"))(
        i < n ? n - 1 - i : i, d);
}
nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned *i) {
    nvmlReturn_t rc = ((nvmlReturn_t(*)(nvmlDevice_t, unsigned *))real("nvmlDeviceGetIndex"))(d, i);
    if (rc == NVML_SUCCESS && i) *i = count() - 1 - *i;
    return rc;
}
nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus, nvmlDevice_t *d) {
    return ((nvmlReturn_t(*)(const char *, nvmlDevice_t *))real("nvmlDeviceGetHandleByPciBusId_v2"))(bus, d);
}
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    return ((nvmlReturn_t(*)(nvmlDevice_t, nvmlMemory_t *))real("nvmlDeviceGetMemoryInfo"))(d, m);
}
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
    return ((nvmlReturn_t(*)(nvmlDevice_t, nvmlMemory_v2_t *))real("nvmlDeviceGetMemoryInfo_v2"))(d, m);
}
