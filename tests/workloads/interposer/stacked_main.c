/* stacked_main: allocates through cudaMalloc with stacked_wrap.so (and maybe vramshim)
 * preloaded; prints what each layer counted. */
#include <dlfcn.h>
#include "check.h"
#include "vs.h"

int main(void) {
    vs_init();
    void *p[5];
    for (int i = 0; i < 5; i++) CK(cudaMalloc(&p[i], 1000 + i));
    for (int i = 0; i < 5; i++) CK(cudaFree(p[i]));
    int (*wrapped)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "stacked_wrap_calls");
    printf("wrapper calls=%d\n", wrapped ? wrapped() : -1);
    EXPECT_VS("calls.cudaMalloc", 5);
    EXPECT_VS("live_entries", 0);
    printf("stacked: ok\n");
    return 0;
}
