/* trace_fork: the parent makes one traced call that does not initialise CUDA (an NVML memory
 * query, as a launcher or nvidia-smi-like check would), then forks; the child allocates 20002
 * bytes and exits; the parent waits, then allocates 10001 and 30003 bytes. (A child of a
 * process that initialised CUDA cannot use CUDA, on a real GPU as on cuda-sim.)
 * Prints "child PID" and "parent PID". Link with libnvidia-ml.so.1. */
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"

int main(void) {
    void *a = 0, *b = 0, *c = 0;
    nvmlDevice_t dev;
    nvmlMemory_t mem;
    if (nvmlInit_v2() != 0 || nvmlDeviceGetHandleByIndex_v2(0, &dev) != 0 ||
        nvmlDeviceGetMemoryInfo(dev, &mem) != 0) {
        fprintf(stderr, "nvml failed\n");
        return 1;
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        return 1;
    }
    if (pid == 0) {
        CK(cudaMalloc(&b, 20002));
        CK(cudaFree(b));
        printf("child %d\n", (int)getpid());
        fflush(stdout);
        exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "child failed\n");
        return 1;
    }
    CK(cudaMalloc(&a, 10001));
    CK(cudaMalloc(&c, 30003));
    CK(cudaFree(c));
    CK(cudaFree(a));
    printf("parent %d\n", (int)getpid());
    return 0;
}
