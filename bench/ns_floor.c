/* The kernel's own price of a sandbox's namespaces, with nothing in them: N times clone(FLAGS)
 * of a child that exits at once, reaped; the machine's busy time (/proc/stat, every CPU, so a
 * network namespace's cleanup in a kworker counts) divided by N, read after 1.5 s of settling.
 * A floor for one-shot throughput: whatever runs in the sandbox comes on top of it.
 *
 *   gcc -O2 -o /tmp/ns_floor bench/ns_floor.c
 *   /tmp/ns_floor 0x7e020000 1000   # as root: user, mount, pid, net, ipc, uts, cgroup
 *   /tmp/ns_floor 0x3e020000 1000   # the same without the network namespace
 */
#define _GNU_SOURCE
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long busy_ticks(void) {
    long v[8] = {0};
    FILE *f = fopen("/proc/stat", "r");
    if (!f || fscanf(f, "cpu %ld %ld %ld %ld %ld %ld %ld %ld", &v[0], &v[1], &v[2], &v[3],
                     &v[4], &v[5], &v[6], &v[7]) != 8) {
        perror("/proc/stat");
        exit(1);
    }
    fclose(f);
    /* user, nice, system, irq, softirq: not idle, iowait, or steal (the hypervisor's, not ours) */
    return v[0] + v[1] + v[2] + v[5] + v[6];
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s CLONE_FLAGS N\n", argv[0]);
        return 2;
    }
    long flags = strtol(argv[1], NULL, 0), n = atol(argv[2]);
    double tick_ms = 1000.0 / sysconf(_SC_CLK_TCK);
    usleep(200000);
    long before = busy_ticks();
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long k = 0; k < n; k++) {
        pid_t p = syscall(SYS_clone, flags | SIGCHLD, 0, 0, 0, 0);
        if (p == 0) _exit(0);
        if (p < 0) { perror("clone"); return 1; }
        waitpid(p, NULL, 0);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    usleep(1500000);
    long after = busy_ticks();
    double wall = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
    printf("flags=%#lx wall %.3f ms/clone, machine busy %.3f ms/clone\n", flags, wall / n,
           (after - before) * tick_ms / n);
    return 0;
}
