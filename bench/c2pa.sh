#!/usr/bin/env bash
# What C2PA signing costs per image, side by side with what drawing that image costs, in one
# run (ratios matter on this shared, noisy machine, not absolutes):
#   1. the runtime's matplotlib renders and saves figures of 640x480 and 1920x1080 (PNG) and
#      PIL saves a 1920x1080 JPEG: the median time of each (the work a cell does anyway);
#   2. the same files are signed as `runcell serve` signs a result (runcell-c2pa, release),
#      median and p90 of N signatures, and the bytes the manifest adds; each signed copy is
#      checked to read back Trusted.
# Usage: bench/c2pa.sh [N=50]   (needs a runcell Python runtime: RUNCELL_BENCH_DATA, default
#   /var/tmp/runcell-bench, as bench/oneshot.sh installs it)
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-50}
cache=${RUNCELL_BENCH_DATA:-/var/tmp/runcell-bench}
py=$(ls -d "$cache"/runtimes/python-*/bin/python3 | head -1)
work=$(mktemp -d /var/tmp/runcell-c2pa.XXXXXX)
trap 'rm -rf "$work"' EXIT
"$py" - "$work" "$n" <<'PY'
import statistics, sys, time
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from PIL import Image
work, n = sys.argv[1], int(sys.argv[2])
def timed(f):
    ts = []
    for _ in range(n):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3
x = np.linspace(0, 10, 500)
for name, size in [("fig-640x480.png", (6.4, 4.8)), ("fig-1920x1080.png", (19.2, 10.8))]:
    def draw():
        fig, ax = plt.subplots(figsize=size, dpi=100)
        ax.plot(x, np.sin(x)); ax.set_title("bench")
        fig.savefig(f"{work}/{name}"); plt.close(fig)
    print(f"{work}/{name}\tmatplotlib draw+savefig median {timed(draw):.2f} ms")
rng = np.random.default_rng(1)
photo = Image.fromarray(rng.integers(0, 255, (1080, 1920, 3), dtype=np.uint8))
print(f"{work}/photo-1920x1080.jpg\tPIL save median {timed(lambda: photo.save(f'{work}/photo-1920x1080.jpg', quality=85)):.2f} ms")
PY
cargo run ${RUNCELL_C2PA_PROFILE:---release} -q -p runcell-c2pa --example sign_cost -- "$n" \
  "$work/fig-640x480.png" "$work/fig-1920x1080.png" "$work/photo-1920x1080.jpg"
