// What pid 1's own copy of the zygote costs a one-shot, and what sharing it would save
// (docs/benchmarks.md, "Issue 23, fourteenth session"). Not runcell's code: a model of its
// process structure, without namespaces (their price is the same in every mode; bench/ns_floor.c
// measures it), so that only the address-space work differs between the modes.
//
// A "zygote" maps ANON_MB of anonymous memory in 1 MiB mappings and writes every page (resident
// anonymous memory, as a preloaded interpreter's arenas are), then, N times, one after the other:
//
//   copy    pid 1 is a fork of the zygote, the program a fork of pid 1 (runcell today: two copies
//           of the page tables, two teardowns; pid 1 writes PID1_PAGES pages of its own).
//   shared  pid 1 shares the zygote's memory (CLONE_VM | CLONE_VFORK, its own small stack), forks
//           the program (one copy) and waits for it with raw system calls; its exit frees no
//           memory. The zygote is suspended until pid 1 has forked.
//   exec    as shared, but pid 1 then execs this binary as a small init (`init`) that waits for
//           the program: what a pid 1 that must not stay in the zygote's memory would pay.
//
// The program writes PROGRAM_PAGES pages (copy-on-write faults, as a print(1) run copies ~550)
// and exits. The figures per run: the CPU of the process tree (getrusage: this process and every
// descendant waited for), the machine's busy time (/proc/stat: all CPUs, without idle, iowait
// and the hypervisor's steal; only meaningful on a quiet machine) and the wall time.
//
//   gcc -O2 -static -o /tmp/pid1_copy bench/pid1_copy.c
//   /tmp/pid1_copy copy 2000 [ANON_MB=17] [PROGRAM_PAGES=550] [PID1_PAGES=50]
#define _GNU_SOURCE
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096
#define CHUNK (1 << 20)

static char **chunks;
static long nchunks, program_pages, pid1_pages;
static int mode_exec;
static char self_path[64];

static double busy_ms(void) {
    unsigned long long v[10] = {0};
    FILE *f = fopen("/proc/stat", "r");
    if (!f || fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
                     &v[4], &v[5], &v[6], &v[7]) != 8) {
        perror("/proc/stat");
        exit(1);
    }
    fclose(f);
    // user nice system idle iowait irq softirq steal: busy = all but idle, iowait, steal.
    return (double)(v[0] + v[1] + v[2] + v[5] + v[6]) * 1000.0 / sysconf(_SC_CLK_TCK);
}

// CPU of this process and of every descendant waited for (pid 1, the program), in ms: steadier
// than the machine's busy time on a shared machine, but blind to work done in kernel threads.
static double tree_cpu_ms(void) {
    struct rusage self, kids;
    getrusage(RUSAGE_SELF, &self);
    getrusage(RUSAGE_CHILDREN, &kids);
    double us = 0;
    struct timeval *t[] = {&self.ru_utime, &self.ru_stime, &kids.ru_utime, &kids.ru_stime};
    for (int i = 0; i < 4; i++)
        us += t[i]->tv_sec * 1e6 + t[i]->tv_usec;
    return us / 1e3;
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

// Writes `n` pages spread over the zygote's memory (one per stride), as a run dirties objects
// across the interpreter's arenas.
static void touch(long n, long salt) {
    long total = nchunks * (CHUNK / PAGE);
    long stride = total / (n ? n : 1);
    for (long i = 0; i < n; i++) {
        long p = (i * stride + salt) % total;
        chunks[p / (CHUNK / PAGE)][(p % (CHUNK / PAGE)) * PAGE] += 1;
    }
}

static long raw_fork(void) { return syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0); }

static void program(void) {
    touch(program_pages, 7);
    syscall(SYS_exit_group, 0);
}

// pid 1 in the zygote's memory: only raw system calls and its own stack.
static int shared_pid1(void *arg) {
    (void)arg;
    long pid = raw_fork();
    if (pid == 0)
        program();
    if (mode_exec) {
        char *argv[] = {self_path, "init", NULL};
        syscall(SYS_execve, self_path, argv, NULL);
        syscall(SYS_exit_group, 127);
    }
    syscall(SYS_wait4, pid, 0, 0, 0);
    syscall(SYS_exit_group, 0);
    return 0;
}

static void copy_pid1(void) {
    touch(pid1_pages, 3);
    long pid = raw_fork();
    if (pid == 0)
        program();
    waitpid(pid, 0, 0);
    _exit(0);
}

int main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "init") == 0) {
        // The small exec'd pid 1: wait for the program, then leave.
        while (wait(0) > 0) {
        }
        return 0;
    }
    if (argc < 3) {
        fprintf(stderr, "usage: %s copy|shared|exec N [ANON_MB] [PROGRAM_PAGES] [PID1_PAGES]\n",
                argv[0]);
        return 2;
    }
    const char *mode = argv[1];
    long n = atol(argv[2]);
    nchunks = argc > 3 ? atol(argv[3]) : 17;
    program_pages = argc > 4 ? atol(argv[4]) : 550;
    pid1_pages = argc > 5 ? atol(argv[5]) : 50;
    mode_exec = strcmp(mode, "exec") == 0;
    int copy = strcmp(mode, "copy") == 0;
    if (!copy && !mode_exec && strcmp(mode, "shared") != 0) {
        fprintf(stderr, "mode: copy, shared or exec\n");
        return 2;
    }
    ssize_t len = readlink("/proc/self/exe", self_path, sizeof self_path - 1);
    if (len <= 0 || len >= (ssize_t)sizeof self_path - 1) {
        fprintf(stderr, "put the binary at a short path (/tmp/pid1_copy)\n");
        return 2;
    }
    self_path[len] = 0;
    chunks = calloc(nchunks, sizeof *chunks);
    for (long i = 0; i < nchunks; i++) {
        chunks[i] = mmap(0, CHUNK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (chunks[i] == MAP_FAILED) {
            perror("mmap");
            return 1;
        }
        // Keep each its own mapping (as the interpreter's arenas are), not merged into one.
        madvise(chunks[i], CHUNK, MADV_NOHUGEPAGE);
        memset(chunks[i], 1, CHUNK);
    }
    char *stack = mmap(0, 1 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    double b0 = busy_ms(), c0 = tree_cpu_ms(), t0 = now_ms();
    for (long i = 0; i < n; i++) {
        long pid;
        if (copy) {
            pid = raw_fork();
            if (pid == 0)
                copy_pid1();
        } else {
            pid = clone(shared_pid1, stack + (1 << 16), CLONE_VM | CLONE_VFORK | SIGCHLD, 0);
        }
        if (pid < 0) {
            perror("clone");
            return 1;
        }
        waitpid(pid, 0, 0);
    }
    double busy = busy_ms() - b0, cpu = tree_cpu_ms() - c0, wall = now_ms() - t0;
    printf("%-6s %ld runs, %ld MiB, program %ld pages, pid 1 %ld: cpu %.3f ms/run, machine busy "
           "%.3f ms/run, wall %.3f ms/run\n",
           mode, n, nchunks, program_pages, copy ? pid1_pages : 0L, cpu / n, busy / n, wall / n);
    return 0;
}
