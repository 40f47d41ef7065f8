/* stacked_wrap: another LD_PRELOAD interposer stacked with ours. It wraps cudaMalloc the
 * classic way, dlsym(RTLD_NEXT, "cudaMalloc"), and counts its calls. Whatever the order of
 * the two in LD_PRELOAD, RTLD_NEXT must keep meaning "after the caller" (our dlsym
 * tail-jumps into glibc's, so glibc still sees the wrapper as the caller): no recursion,
 * every call reaches the runtime exactly once. Build: gcc -shared -fPIC -o wrap.so ... -ldl */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>

static int calls;
int stacked_wrap_calls(void) { return calls; }

int cudaMalloc(void **p, size_t n) {
    static int (*next)(void **, size_t);
    if (!next) next = (int (*)(void **, size_t))dlsym(RTLD_NEXT, "cudaMalloc");
    if (!next) return 35;
    calls++;
    return next(p, n);
}
