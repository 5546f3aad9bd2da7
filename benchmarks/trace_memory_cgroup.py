"""The memory a trace analysis charges the kernel, by shardctl and by HTA: a cross-check of
`profile_analyze.py`'s whole-tree peak that samples nothing.

Each tool runs in `profile_analyze.py`'s child for it (the same analysis it times), which imports its
code, then moves itself into a memory cgroup of its own (cgroup v1's memory controller, created under
this process's memory cgroup and removed at the end), resets the cgroup's high-water mark and runs the
analysis. The figure is the cgroup's peak charge above its charge after the move. Pages a process
already has stay charged where they were (v1 moves no charge by default), so the imports are left out,
as in `profile_analyze.py`; what the analysis and any process it forks fault in from then on is charged:
anonymous pages, the pages a forked worker copies on write, and page cache not already cached. Code
pages of a library already in the page cache (numpy's, pandas') are charged to whoever read them first,
so they count here for neither tool, where `profile_analyze.py`'s RSS figures count them for both. The
kernel charges in batches of up to 32 pages a CPU, so figures under a MB or so are coarse.

    .venv/bin/python benchmarks/trace_memory_cgroup.py --traces FILES --hta-python /tmp/hta-venv/bin/python
        [--runs 3]

It needs write access to `/sys/fs/cgroup/memory` (root on a cgroup v1 host, as this machine is) and
says so otherwise. It exits 0 whether or not the goal (at most a fifth of HTA's figure) is met.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from profile_analyze import (
    CGROUP_ENV,
    GOAL_MEMORY,
    HTA_CHILD,
    OURS_CHILD,
    hta_rank_files,
    run_child,
    trace_folder,
    verdict,
)
from side_by_side import compiled

ROOT = Path(__file__).resolve().parents[1]


def memory_cgroup_root() -> Path:
    """This process's own memory cgroup (v1), where the children's cgroups are made."""
    with open("/proc/self/cgroup") as fh:
        for line in fh:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if "memory" in controllers.split(","):
                return Path("/sys/fs/cgroup/memory") / path.lstrip("/")
    raise SystemExit("no cgroup v1 memory controller here (/proc/self/cgroup names none): this cross-check needs one")


def charged(python: str, code: str, cgroup: Path, *args: str) -> float:
    """MB that `profile_analyze`'s child `code` charged `cgroup` at its peak, above its charge once the
    child's imports were done; the cgroup is made and removed here."""
    cgroup.mkdir()
    try:
        out = run_child(python, code, *args, env={**os.environ, CGROUP_ENV: str(cgroup)})
        return float(out["charged"]) / 2**20  # type: ignore[arg-type]
    finally:
        cgroup.rmdir()  # its processes have exited; their charges move to the parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", type=Path, nargs="+", required=True, help="one trace file per rank, one folder")
    parser.add_argument("--hta-python", required=True, help="an interpreter with HolisticTraceAnalysis 0.5.0")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    paths = [p.resolve() for p in args.traces]
    folder = trace_folder(paths)
    root = memory_cgroup_root()
    if not os.access(root, os.W_OK):
        raise SystemExit(f"{root} is not writable: run as root on a cgroup v1 host")
    compiled(ROOT)
    pairs = hta_rank_files(paths)
    probe = root / f"shardctl-bench-{os.getpid()}"
    print(f"{len(paths)} ranks in {folder}; memory charged above the imports (cgroup v1, {root})")
    for run in range(1, args.runs + 1):
        ours = charged(sys.executable, OURS_CHILD, probe, str(ROOT), "time", *map(str, paths))
        hta = charged(args.hta_python, HTA_CHILD, probe, str(folder), *pairs)
        ratio = hta / max(ours, 0.1)
        print(f"run {run}: shardctl +{ours:.2f} MB, HTA 0.5.0 +{hta:.2f} MB (its workers included): {ratio:.1f}x "
              f"(goal >= {GOAL_MEMORY:g}x: {verdict(ratio, GOAL_MEMORY)})")


if __name__ == "__main__":
    main()
