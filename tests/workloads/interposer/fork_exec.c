/* fork_exec: the preload across fork and exec.
 *   fork_exec fork   - a child forked before CUDA is initialized allocates and exits; then
 *                      the parent allocates, forks a second child (its table starts clean;
 *                      CUDA itself is unusable after a fork, the child gets the driver's
 *                      error exactly as without the preload), and continues.
 *   fork_exec exec   - the parent allocates, then fork+execs itself as "child": the preload
 *                      is inherited and the child's allocations are intercepted.
 *   fork_exec child  - (exec'd) allocate, check, print. */
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"
#include "vs.h"

static int wait_child(pid_t pid) {
    int st = 0;
    EXPECT(waitpid(pid, &st, 0) == pid);
    EXPECT(WIFEXITED(st));
    return WEXITSTATUS(st);
}

static int child_allocates(void) {
    /* a fresh process image or a child of a parent that never initialized CUDA */
    EXPECT_VS("live_entries", 0);
    void *p;
    CK(cudaMalloc(&p, 1 << 20));
    EXPECT_VS("live_count.0", 1);
    EXPECT_VS("live_bytes.0", 1 << 20);
    EXPECT_VS("calls.cudaMalloc", 1);
    CK(cudaFree(p));
    EXPECT_VS("live_count.0", 0);
    return 0;
}

int main(int argc, char **argv) {
    int pre = vs_init();
    const char *mode = argc > 1 ? argv[1] : "fork";
    if (!strcmp(mode, "child")) {
        child_allocates();
        printf("child: ok interposed=%d\n", pre);
        return 0;
    }
    if (!strcmp(mode, "fork")) {
        fflush(stdout);
        pid_t a = fork();
        if (a == 0) _exit(child_allocates());
        printf("child A exit=%d\n", wait_child(a));
    }
    void *p[3];
    for (int i = 0; i < 3; i++) CK(cudaMalloc(&p[i], 4096u << i));
    EXPECT_VS("live_count.0", 3);
    fflush(stdout);
    pid_t b = fork();
    if (b == 0) {
        if (!strcmp(mode, "exec")) {
            execl("/proc/self/exe", argv[0], "child", (char *)NULL);
            _exit(127);
        }
        /* the parent's allocations are not the child's */
        EXPECT_VS("live_entries", 0);
        EXPECT_VS("live_count.0", 0);
        EXPECT_VS("calls.cudaMalloc", 0);
        void *q = NULL;
        cudaError_t e = cudaMalloc(&q, 1 << 20);
        printf("child B cudaMalloc -> %d\n", (int)e);
        fflush(stdout);
        EXPECT_VS("calls.cudaMalloc", 1);
        if (e == cudaSuccess) {
            EXPECT_VS("live_count.0", 1);
            CK(cudaFree(q));
        } else {
            EXPECT_VS("live_count.0", 0);
        }
        _exit(0);
    }
    printf("child B exit=%d\n", wait_child(b));
    /* the parent carries on */
    EXPECT_VS("live_count.0", 3);
    void *r;
    CK(cudaMalloc(&r, 12345));
    EXPECT_VS("live_count.0", 4);
    for (int i = 0; i < 3; i++) CK(cudaFree(p[i]));
    CK(cudaFree(r));
    EXPECT_VS("live_count.0", 0);
    EXPECT_VS("calls.cudaMalloc", 4 + (strcmp(mode, "fork") ? 0 : 0));
    printf("parent: ok\n");
    return 0;
}
