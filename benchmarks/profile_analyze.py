"""Time and peak memory of ``analyze_traces`` on a large synthetic multi-rank GPU trace set.

Usage::

    .venv/bin/python benchmarks/profile_analyze.py [--ranks 4] [--steps 20] [--kernels 500] [--dir DIR]

If HolisticTraceAnalysis is importable in the running interpreter, HTA's temporal breakdown and
comm-comp overlap are timed on the same files and the ratios are printed; otherwise it says so.
Our peak memory is measured with tracemalloc (Python allocations); HTA's with ru_maxrss of a child.
"""

from __future__ import annotations

import argparse
import importlib.util
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "profiles" / "fixtures"))

from make_synthetic_gpu_traces import write_rank_traces  # type: ignore[import-not-found]  # noqa: E402

from service.profiles import analyze_traces  # noqa: E402

_HTA_CHILD = """
import resource, sys, time
from hta.trace_analysis import TraceAnalysis
files = dict(enumerate(sys.argv[2:]))
t0 = time.perf_counter()
a = TraceAnalysis(trace_files=files, trace_dir=sys.argv[1])
a.get_temporal_breakdown(visualize=False)
a.get_comm_comp_overlap(visualize=False)
print(time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--kernels", type=int, default=500, help="kernels per step")
    ap.add_argument("--dir", type=Path, default=None)
    args = ap.parse_args()
    out = args.dir or Path(tempfile.mkdtemp(prefix="shardctl-profile-bench-"))
    paths = write_rank_traces(out, world=args.ranks, steps=args.steps, kernels_per_step=args.kernels)
    size = sum(p.stat().st_size for p in paths)
    n_events = args.ranks * args.steps * (2 * args.kernels + 3)
    print(f"trace set: {len(paths)} ranks, ~{n_events} events, {size / 1e6:.1f} MB gzip in {out}")

    # Time without tracing (tracemalloc slows Python allocation-heavy code several-fold), then a
    # second pass under tracemalloc for the peak of Python allocations.
    t0 = time.perf_counter()
    summary = analyze_traces(paths)
    ours_s = time.perf_counter() - t0
    tracemalloc.start()
    analyze_traces(paths)
    _, ours_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(
        f"shardctl: {ours_s:.2f} s, peak {ours_peak / 1e6:.1f} MB (tracemalloc, second pass); "
        f"verdict {summary.diagnosis.bound}"
    )
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(f"shardctl process max RSS (includes interpreter and tracemalloc overhead): {rss / 1e6:.1f} MB")

    if importlib.util.find_spec("hta") is None:
        print("HTA (HolisticTraceAnalysis) is not available in this interpreter: no side-by-side comparison")
        return
    res = subprocess.run(
        [sys.executable, "-c", _HTA_CHILD, str(out), *map(str, paths)],
        capture_output=True,
        text=True,
        check=True,
    )
    hta_s, hta_rss = (float(x) for x in res.stdout.strip().splitlines()[-1].split())
    print(f"HTA: {hta_s:.2f} s, max RSS {hta_rss / 1e6:.1f} MB")
    print(
        f"ratios HTA/shardctl: time {hta_s / ours_s:.2f}x, memory {hta_rss / max(ours_peak, 1):.2f}x "
        "(HTA RSS vs our tracemalloc peak)"
    )


if __name__ == "__main__":
    main()
