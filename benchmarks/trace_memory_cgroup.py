"""The memory a trace analysis charges the kernel, by shardctl and by HTA: a cross-check of
`profile_analyze.py`'s whole-tree peak that samples nothing (issue 17).

Each tool runs in a child process that imports its code, then moves itself into a memory cgroup of
its own (cgroup v1's memory controller, created under this process's memory cgroup and removed at the
end), resets the cgroup's high-water mark and runs the analysis. The figure is the cgroup's peak
charge above its charge after the move. Pages a process already has stay charged where they were
(v1 moves no charge by default), so the imports are left out, as in `profile_analyze.py`; what the
analysis and any process it forks fault in from then on is charged: anonymous pages, the pages a
forked worker copies on write, and page cache not already cached. Code pages of a library already
in the page cache (numpy's, pandas') are charged to whoever read them first, so they count here for
neither tool, where `profile_analyze.py`'s RSS figures count them for both. The kernel charges
in batches of up to 32 pages a CPU, so figures under a MB or so are coarse.

    .venv/bin/python benchmarks/trace_memory_cgroup.py --traces FILES --hta-python /tmp/hta-venv/bin/python
        [--runs 3]

It needs write access to `/sys/fs/cgroup/memory` (root on a cgroup v1 host, as this machine is) and
says so otherwise. It exits 0 whether or not the goal (at most a fifth of HTA's figure) is met.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from profile_analyze import GOAL_MEMORY, _rank_of, _result, _verdict
from side_by_side import compiled

ROOT = Path(__file__).resolve().parents[1]

# argv: the cgroup's folder, then the tool's own arguments. Prints {"charged": bytes}.
_ENTER = """
import json, os, sys
cgroup = sys.argv[1]
def read(name):
    with open(os.path.join(cgroup, name)) as fh:
        return int(fh.read())
def enter():
    with open(os.path.join(cgroup, "cgroup.procs"), "w") as fh:
        fh.write(str(os.getpid()))
    with open(os.path.join(cgroup, "memory.max_usage_in_bytes"), "w") as fh:
        fh.write("0")  # v1: resets the high-water mark to the charge now
    return read("memory.usage_in_bytes")
"""

_OURS = _ENTER + """
sys.path.insert(0, sys.argv[2])
from service.profiles import analyze_traces
before = enter()
analyze_traces(sys.argv[3:])
print(json.dumps({"charged": read("memory.max_usage_in_bytes") - before}))
"""

_HTA = _ENTER + """
from hta.trace_analysis import TraceAnalysis
before = enter()
files = {int(rank): name for rank, name in (arg.split("=", 1) for arg in sys.argv[3:])}
analysis = TraceAnalysis(trace_files=files, trace_dir=sys.argv[2])
analysis.get_temporal_breakdown(visualize=False)
analysis.get_comm_comp_overlap(visualize=False)
print(json.dumps({"charged": read("memory.max_usage_in_bytes") - before}))
"""


def memory_cgroup_root() -> Path:
    """This process's own memory cgroup (v1), where the children's cgroups are made."""
    with open("/proc/self/cgroup") as fh:
        for line in fh:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if "memory" in controllers.split(","):
                return Path("/sys/fs/cgroup/memory") / path.lstrip("/")
    raise SystemExit("no cgroup v1 memory controller here (/proc/self/cgroup names none): this cross-check needs one")


def charged(python: str, code: str, cgroup: Path, *args: str) -> float:
    """MB the child's analysis charged its cgroup at its peak; the cgroup is made and removed here."""
    cgroup.mkdir()
    try:
        done = subprocess.run([python, "-c", code, str(cgroup), *args], capture_output=True, text=True)
        out = _result(python, done.returncode, done.stdout, done.stderr)
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
    if len({p.parent for p in paths}) != 1:
        raise SystemExit("--traces: put the files in one folder (HTA reads a trace directory)")
    root = memory_cgroup_root()
    if not os.access(root, os.W_OK):
        raise SystemExit(f"{root} is not writable: run as root on a cgroup v1 host")
    compiled(ROOT)
    pairs = [f"{_rank_of(p, index)}={p.name}" for index, p in enumerate(paths)]
    probe = root / f"shardctl-bench-{os.getpid()}"
    print(f"{len(paths)} ranks in {paths[0].parent}; memory charged above the imports (cgroup v1, {root})")
    for run in range(1, args.runs + 1):
        ours = charged(sys.executable, _OURS, probe, str(ROOT), *map(str, paths))
        hta = charged(args.hta_python, _HTA, probe, str(paths[0].parent), *pairs)
        ratio = hta / max(ours, 0.1)
        print(f"run {run}: shardctl +{ours:.2f} MB, HTA 0.5.0 +{hta:.2f} MB (its workers included): {ratio:.1f}x "
              f"(goal >= {GOAL_MEMORY:g}x: {_verdict(ratio, GOAL_MEMORY)})")


if __name__ == "__main__":
    main()
