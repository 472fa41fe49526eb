#!/usr/bin/env python3
"""Where the time of a cold `runcell run FILE` goes, from the kernel's own timestamps.

One `perf record` of the scheduler's tracepoints (process exec, fork, exit) over N runs of each
command, interleaved (so load drifts hit all alike), then per run:

  start -> clone     `runcell` exec'd to its clone of the sandbox's pid 1 (the binary's start,
                     argument parsing, the engine, workspace, cgroup)
  clone -> exec      pid 1's mounts, the program's fork, privileges, Landlock, seccomp, until
                     the interpreter is exec'd
  program            the interpreter's exec to its exit
  exit -> pid 1 gone the program's exit to pid 1's (pid 1 reaps, namespaces torn down)
  pid 1 gone -> end  usage, cgroup and workspace removal, the CLI's report and exit

and beside it the same interpreter started bare (exec to exit). Unlike hyperfine's wall times
these do not include the benchmark harness's fork and wait; they need root (perf's tracepoints)
and are medians with the minimum beside them.

  python3 bench/oneshot_phases.py RUNS PROGRAM PYTHON RUNCELL [RUNCELL...]

RUNCELL binaries are compared side by side (e.g. a branch's against main's); RUNCELL_DATA_DIR
must point at a data dir with the runtime installed. Stdlib only (and perf).
"""

import os
import re
import statistics
import subprocess
import sys
import tempfile

EVENTS = ["sched:sched_process_exec", "sched:sched_process_fork", "sched:sched_process_exit"]
LINE = re.compile(r"\s*(.+?)\s+(\d+)\s+\[\d+\]\s+([\d.]+): sched:(\w+): (.*)")


def record(runs, program, python, binaries):
    """The events of `runs` rounds, each running every command once, in one trace."""
    cmds = [[python, program]] + [[b, "run", program] for b in binaries]
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "loop.sh")
        with open(script, "w") as f:
            f.write("#!/bin/sh\n")
            for _ in range(runs):
                for c in cmds:
                    f.write(" ".join(c) + " >/dev/null\n")
        os.chmod(script, 0o755)
        data = os.path.join(tmp, "perf.data")
        subprocess.run(["perf", "record", "-q", "-a", "-o", data]
                       + [a for e in EVENTS for a in ("-e", e)] + ["--", script],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        out = subprocess.run(["perf", "script", "-i", data], check=True,
                             capture_output=True, text=True).stdout
    events = []
    for line in out.splitlines():
        m = LINE.match(line)
        if m:
            events.append((int(m.group(2)), float(m.group(3)) * 1e3, m.group(4), m.group(5)))
    return events


def runs_of(events, exe):
    """Per run of `exe`: the timestamps of its phases (ms)."""
    runs, by_pid = [], {}
    for pid, t, kind, rest in events:
        if kind == "sched_process_exec" and rest.startswith(f"filename={exe} "):
            r = {"start": t, "pid": pid}
            runs.append(r)
            by_pid[pid] = ("cli", r)
            continue
        owner = by_pid.get(pid)
        if kind == "sched_process_fork" and owner:
            child = int(re.search(r"child_pid=(\d+)", rest).group(1))
            role, r = owner
            if role == "cli" and "clone" not in r:
                r["clone"], r["pid1"] = t, child
                by_pid[child] = ("pid1", r)
            elif role == "pid1" and "prog" not in r:
                r["prog"] = child
                by_pid[child] = ("prog", r)
        elif kind == "sched_process_exec" and owner and owner[0] == "prog":
            owner[1].setdefault("exec", t)
        elif kind == "sched_process_exit" and owner:
            role, r = owner
            key = {"cli": "end", "pid1": "pid1_exit", "prog": "exit"}[role]
            r.setdefault(key, t)
    keys = ["start", "clone", "exec", "exit", "pid1_exit", "end"]
    return [r for r in runs if all(k in r for k in keys)]


def bare_runs(events, python):
    starts, out = {}, []
    for pid, t, kind, rest in events:
        if kind == "sched_process_exec" and rest.startswith(f"filename={python} "):
            starts[pid] = t
        elif kind == "sched_process_exit" and pid in starts:
            out.append(t - starts.pop(pid))
    return out


def cell(xs):
    return f"{statistics.median(xs):.2f} ({min(xs):.2f})" if xs else "-"


def main():
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    runs, program, python = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    binaries = [os.path.realpath(b) for b in sys.argv[4:]]
    python = os.path.abspath(python)
    events = record(runs, program, python, binaries)
    phases = [("start -> clone", "start", "clone"), ("clone -> exec", "clone", "exec"),
              ("program", "exec", "exit"), ("exit -> pid 1 gone", "exit", "pid1_exit"),
              ("pid 1 gone -> end", "pid1_exit", "end"), ("**total**", "start", "end")]
    print("ms, median (min) of", runs, "runs each, interleaved")
    print()
    print("| phase | " + " | ".join(f"`{b}`" for b in binaries) + " |")
    print("|:--|" + "--:|" * len(binaries))
    per = [runs_of(events, b) for b in binaries]
    for label, a, z in phases:
        print(f"| {label} | " + " | ".join(cell([r[z] - r[a] for r in rs]) for rs in per) + " |")
    bare = bare_runs(events, python)
    print(f"| bare `{python} FILE`, exec -> exit | {cell(bare)} |" + " |" * (len(binaries) - 1))


if __name__ == "__main__":
    main()
