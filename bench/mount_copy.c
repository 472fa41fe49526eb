/* What a sandbox's mount namespace costs as its creator's namespace grows: a child that
 * unshares a mount namespace (copying every mount), makes it private, pivots into a tmpfs and
 * detaches the old root, as a sandbox's pid 1 does; RUNS times, with N extra tmpfs mounts
 * (standing in for live workspaces) in the harness's own private namespace. Prints the
 * children's CPU per run. Root only (docs/benchmarks.md, seventeenth session).
 *
 *   gcc -O2 -o /tmp/mount_copy bench/mount_copy.c && /tmp/mount_copy 0 300 && /tmp/mount_copy 500 300
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define DIR "/tmp/mount_copy.d"

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static double children_cpu_ms(void) {
    struct rusage ru;
    getrusage(RUSAGE_CHILDREN, &ru);
    return (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e3 +
           (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e3;
}

/* The sandbox's part: its own copy of the namespace, a new root, the old one detached. */
static void child(void) {
    if (unshare(CLONE_NEWNS)) _exit(1);
    mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL);
    if (mount("root", "/mnt", "tmpfs", 0, NULL) || chdir("/mnt")) _exit(2);
    if (syscall(SYS_pivot_root, ".", ".")) _exit(3);
    umount2(".", MNT_DETACH);
    _exit(0);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s EXTRA_MOUNTS RUNS\n", argv[0]);
        return 2;
    }
    int n = atoi(argv[1]), runs = atoi(argv[2]);
    /* The extra mounts live in this process's namespace only: the host's stays as it was. */
    if (unshare(CLONE_NEWNS)) { perror("unshare"); return 1; }
    mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL);
    mkdir(DIR, 0755);
    for (int i = 0; i < n; i++) {
        char p[64];
        snprintf(p, sizeof p, DIR "/%d", i);
        mkdir(p, 0755);
        if (mount("extra", p, "tmpfs", 0, "size=1m")) { perror("mount"); return 1; }
    }
    double cpu0 = children_cpu_ms(), t0 = now_ms();
    for (int r = 0; r < runs; r++) {
        pid_t pid = fork();
        if (pid == 0) child();
        int status;
        waitpid(pid, &status, 0);
        if (status) { fprintf(stderr, "child failed: %d\n", status); return 1; }
    }
    double wall = now_ms() - t0, cpu = children_cpu_ms() - cpu0;
    printf("extra mounts %d: wall %.3f ms/run, children's CPU %.3f ms/run\n", n, wall / runs,
           cpu / runs);
    for (int i = 0; i < n; i++) {
        char p[64];
        snprintf(p, sizeof p, DIR "/%d", i);
        umount2(p, MNT_DETACH);
        rmdir(p);
    }
    return 0;
}
