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


def sandbox_cgroup_bytes():
    """Memory charged to each live sandbox's cgroup (v1 `memory.usage_in_bytes`, v2
    `memory.current`), by cgroup."""
    found = {}
    for pattern in ("/sys/fs/cgroup/memory/**/rc-*/memory.usage_in_bytes",
                    "/sys/fs/cgroup/**/rc-*/memory.current"):
        for path in glob.glob(pattern, recursive=True):
            try:
                found[os.path.dirname(path)] = int(open(path).read())
            except (OSError, ValueError):
                pass
    return found


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
    for sid in ids:
        c.delete(sid)
    json.dump(res, open(out, "w"), indent=2)
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
