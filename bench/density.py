#!/usr/bin/env python3
"""Density of live sessions that rendered a matplotlib figure (issue 23, item 5).

N sessions are created one after the other on a running server; each runs a pandas cell that
renders a figure to PNG (`savefig`) and stays alive. Then, per session:

  - MemAvailable's drop / N (the issue's measure; noisy while other work on the host allocates
    or frees memory, so the run is only as good as the host is quiet);
  - the mean of the sessions' memory cgroups' usage (what the kernel charges to each sandbox:
    its private pages, its page tables, its tmpfs files), which other work on the host does not
    disturb, but which leaves out what a session costs outside its cgroup (the server's own
    bookkeeping, the zygote's pages that a copy-on-write has left to the session alone).

With DENSITY_KSM_WAIT=1 (bench/density.sh sets it for a server started with
--merge-session-pages, and starts the KSM daemon) the measure waits until the daemon has scanned
everything twice, and records its counters.

  python3 bench/density.py BASE_URL N OUT_JSON        (stdlib only; as root, for the cgroups)
"""

import glob
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sessions import Client, mem_available_kib  # noqa: E402

CELL = (
    "import io, numpy as np, pandas as pd, matplotlib.pyplot as plt\n"
    "df = pd.DataFrame({'x': np.arange(100), 'y': np.random.rand(100)})\n"
    "fig, ax = plt.subplots(); ax.plot(df.x, df.y); ax.set_title('y')\n"
    "buf = io.BytesIO(); fig.savefig(buf, format='png'); plt.close(fig)\n"
    "len(buf.getvalue()) > 1000, df.describe().shape"
)


def own_cgroup_dirs():
    """This process's memory cgroup directories (v1 and v2). A server started by the same
    script lives in the same cgroup and makes its sandboxes' cgroups below it: sandboxes of
    other servers on the host (elsewhere in the tree) are not counted."""
    v1 = v2 = None
    for line in open("/proc/self/cgroup"):
        _, controllers, path = line.rstrip("\n").split(":", 2)
        if "memory" in controllers.split(","):
            v1 = "/sys/fs/cgroup/memory" + path.rstrip("/")
        elif controllers == "":
            v2 = "/sys/fs/cgroup" + path.rstrip("/")
    # With the v1 memory controller mounted, the v2 line ("0::/") names the unified root,
    # under which every cgroup of the host lies.
    return [v1] if v1 else [v2] if v2 else []


def sandbox_cgroup_bytes():
    """Memory charged to each live sandbox's cgroup (v1 `memory.usage_in_bytes`, v2
    `memory.current`), by cgroup, for sandboxes below this process's own cgroup."""
    found = {}
    for root in own_cgroup_dirs():
        for path in (glob.glob(f"{glob.escape(root)}/**/rc-*/memory.usage_in_bytes", recursive=True)
                     + glob.glob(f"{glob.escape(root)}/**/rc-*/memory.current", recursive=True)):
            try:
                found[os.path.dirname(path)] = int(open(path).read())
            except (OSError, ValueError):
                pass
    return found


def ksm_value(name):
    return int(open(f"/sys/kernel/mm/ksm/{name}").read())


def main():
    base, n, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    c = Client(base)
    # One session first: the server's and the zygote's own first-use costs are not counted.
    _, warm = c.create()
    c.execute(warm, CELL)
    c.delete(warm)
    time.sleep(1)
    existing = set(sandbox_cgroup_bytes())
    before = mem_available_kib()
    ids = []
    t = time.perf_counter()
    for _ in range(n):
        _, sid = c.create()
        _, e = c.execute(sid, CELL)
        if "(True, (8, 2))" not in json.dumps(e["results"]):
            raise RuntimeError(f"unexpected result: {e['results']}")
        ids.append(sid)
    elapsed = time.perf_counter() - t
    time.sleep(2)
    ksm = None
    if os.environ.get("DENSITY_KSM_WAIT") == "1":
        # Sessions marked mergeable (serve --merge-session-pages): measured once the KSM
        # daemon has settled, i.e. a whole scan merged less than 1% more (a page is merged at
        # the earliest on the scan after the one that first saw it; two scans are not always
        # enough while the daemon is short of CPU), at most 30 minutes.
        c.conn.close()
        t0 = time.perf_counter()
        scans, profit = ksm_value("full_scans"), ksm_value("general_profit")
        settled = 0
        while settled < 2 and time.perf_counter() - t0 < 1800:
            time.sleep(2)
            if ksm_value("full_scans") > scans:
                now = ksm_value("general_profit")
                settled = settled + 1 if now - profit < max(profit, 1) / 100 else 0
                scans, profit = ksm_value("full_scans"), now
        ksm = {"seconds_waited": round(time.perf_counter() - t0, 1),
               "pages_sharing": ksm_value("pages_sharing"),
               "pages_shared": ksm_value("pages_shared"),
               "general_profit_mib": round(ksm_value("general_profit") / 2**20, 1)}
    after = mem_available_kib()
    groups = {k: v for k, v in sandbox_cgroup_bytes().items() if k not in existing}
    res = {
        "sessions": n,
        "mem_available_drop_mib": round((before - after) / 1024, 1),
        "mib_per_session": round((before - after) / 1024 / n, 2),
        "cgroups_seen": len(groups),
        "cgroup_mib_per_session": round(sum(groups.values()) / 2**20 / max(1, len(groups)), 2),
        "seconds_to_fill": round(elapsed, 1),
    }
    if ksm is not None:
        res["ksm"] = ksm
    c = Client(base)
    # The first and the last session still compute after the wait (and, with KSM, on merged
    # pages: a write to one is a copy again, so the result must not change).
    for sid in (ids[0], ids[-1]):
        _, e = c.execute(sid, CELL)
        if "(True, (8, 2))" not in json.dumps(e["results"]):
            raise RuntimeError(f"unexpected result after the wait: {e['results']}")
    for sid in ids:
        c.delete(sid)
    json.dump(res, open(out, "w"), indent=2)
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
