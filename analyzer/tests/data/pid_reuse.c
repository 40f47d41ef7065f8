/* pid_reuse VRAMSHIM: does `vramshim run` forward a signal to a process that got its child's
 * pid after the child was reaped?
 *
 * In a pid namespace of its own (no other process takes pids there; as root directly, else
 * inside a user namespace), pid 1 runs `VRAMSHIM_RUN_FAULT=late-clear vramshim run -- sh -c
 * 'echo $$'`: the child prints its pid and exits; the launcher reaps it and, under the fault,
 * keeps forwarding for 3 s after one line on stderr. Then a decoy process is made to get the
 * child's pid (ns_last_pid), the launcher gets SIGTERM (forwarded to its child), and the decoy
 * must not be hit.
 * Prints one line; exit 0: decoy untouched; 1: decoy killed; 77: no namespace could be made;
 * anything else: the setup failed. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int write_file(const char *path, const char *text) {
    int fd = open(path, O_WRONLY);
    if (fd < 0) return -1;
    ssize_t n = write(fd, text, strlen(text));
    close(fd);
    return n == (ssize_t)strlen(text) ? 0 : -1;
}

/* Reads `fd` until `needle` is seen (0), or end of file / `limit_ms` (-1). */
static int read_until(int fd, char *buf, size_t cap, const char *needle, int limit_ms) {
    size_t len = 0;
    buf[0] = 0;
    for (int waited = 0; waited < limit_ms; waited += 100) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (poll(&pfd, 1, 100) <= 0) continue;
        ssize_t n = read(fd, buf + len, cap - 1 - len);
        if (n <= 0) return -1;
        len += (size_t)n;
        buf[len] = 0;
        if (strstr(buf, needle)) return 0;
        if (len + 1 >= cap) return -1;
    }
    return -1;
}

static int scenario(const char *vramshim) {
    int out[2], err[2];
    if (pipe(out) || pipe(err)) return 2;
    pid_t launcher = fork();
    if (launcher < 0) return 2;
    if (launcher == 0) {
        dup2(out[1], 1);
        dup2(err[1], 2);
        close(out[0]);
        close(err[0]);
        setenv("VRAMSHIM_RUN_FAULT", "late-clear", 1);
        execl(vramshim, vramshim, "run", "--", "sh", "-c", "echo $$", (char *)NULL);
        _exit(127);
    }
    close(out[1]);
    close(err[1]);
    char buf[4096];
    if (read_until(out[0], buf, sizeof buf, "\n", 30000) != 0) {
        printf("setup: the child printed no pid\n");
        return 2;
    }
    pid_t child = (pid_t)atoi(buf);
    if (read_until(err[0], buf, sizeof buf, "reaped", 30000) != 0) {
        printf("setup: the launcher did not say it reaped its child: %s\n", buf);
        return 2;
    }
    /* The next pid handed out is the child's. */
    char last[32];
    snprintf(last, sizeof last, "%d", (int)child - 1);
    if (write_file("/proc/sys/kernel/ns_last_pid", last) != 0) {
        printf("no namespace: ns_last_pid: %s\n", strerror(errno));
        kill(launcher, SIGKILL);
        return 77;
    }
    pid_t decoy = fork();
    if (decoy < 0) return 2;
    if (decoy == 0) {
        for (;;) pause(); /* SIGTERM's default action ends it */
    }
    if (decoy != child) {
        printf("setup: the decoy got pid %d, not the child's %d\n", (int)decoy, (int)child);
        kill(decoy, SIGKILL);
        return 2;
    }
    /* A signal for the child, landing after it was reaped. */
    kill(launcher, SIGTERM);
    int st = 0;
    waitpid(launcher, &st, 0);
    pid_t r = waitpid(decoy, &st, WNOHANG);
    if (r == decoy) {
        printf("decoy (pid %d) killed by signal %d\n", (int)decoy,
               WIFSIGNALED(st) ? WTERMSIG(st) : 0);
        return 1;
    }
    kill(decoy, SIGKILL);
    waitpid(decoy, &st, 0);
    printf("decoy (pid %d) untouched\n", (int)decoy);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    if (unshare(CLONE_NEWPID) != 0) {
        uid_t uid = getuid();
        gid_t gid = getgid();
        if (unshare(CLONE_NEWUSER | CLONE_NEWPID) != 0) {
            printf("no namespace: unshare: %s\n", strerror(errno));
            return 77;
        }
        char map[64];
        write_file("/proc/self/setgroups", "deny");
        snprintf(map, sizeof map, "0 %d 1", (int)uid);
        write_file("/proc/self/uid_map", map);
        snprintf(map, sizeof map, "0 %d 1", (int)gid);
        write_file("/proc/self/gid_map", map);
    }
    fflush(stdout);
    pid_t init = fork();
    if (init < 0) {
        printf("no namespace: fork: %s\n", strerror(errno));
        return 77;
    }
    if (init == 0) {
        int rc = scenario(argv[1]);
        fflush(stdout);
        _exit(rc);
    }
    int st = 0;
    waitpid(init, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 3;
}
