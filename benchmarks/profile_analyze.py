"""Time and peak memory of ``analyze_traces`` on a multi-rank trace set, side by side with HTA.

Usage::

    .venv/bin/python benchmarks/profile_analyze.py [--ranks 4] [--steps 20] [--kernels 500] [--dir DIR]
    .venv/bin/python benchmarks/profile_analyze.py --traces rank-0.json.gz rank-1.json.gz ...
    .venv/bin/python benchmarks/profile_analyze.py ... --hta-python /path/to/venv-with-hta/bin/python
    .venv/bin/python benchmarks/profile_analyze.py ... --runs 9 [--against DIR]

Without ``--traces`` it writes a synthetic GPU trace set (the generator of the test fixtures). Each tool
runs in a child process of its own, measured the same way: wall time and CPU time of the analysis (CPU
time includes any worker processes: HTA parses ranks in a process pool), and the child's peak RSS above
its RSS once its imports are done (so the interpreter and libraries are not counted for either; in this
figure HTA's workers are left out, which favours HTA). With HTA, one more run of each measures the peak
of its whole process tree: the child's RSS plus the private memory (unique set size) of each process it
started, sampled every 1 to 3 ms. HTA parses each rank in a worker forked from the child; a worker's RSS
counts the pages it shares with its parent, its private memory only what it added, the pages it copied
on write included (the interpreter writes to every object it counts references to or collects). Both
ratios print: the child's alone (a part of HTA's peak) and the whole tree's (what the machine provides;
about a lower bound for HTA, since sampling can miss a short peak and pages the workers share only with
each other count in neither). The memory goal is judged on the whole trees, shardctl's figure being the
higher of its two runs (`docs/benchmarks.md` says why). HTA starts a worker per rank up to the CPU
count, so its whole tree grows with the cores. Both import their code from bytecode: HTA's is compiled
by pip at install, and shardctl's `service` package is compiled here first (`compileall`, into its
`__pycache__` folders). Compiling source at import leaves the heap a few hundred KB of freed memory that
the analysis then reuses without growing RSS, which made the small sets read up to 0.8 MB lighter than
an installed shardctl would run (found 2026-12-06: `synthetic_gpu_epoch` +1.5 MB with source, +2.2 MB
with bytecode). Each figure is printed next to its goal (5x faster than HTA, a fifth of its
memory) with the 1-minute load average, since this machine is shared. shardctl also reports its
tracemalloc peak (Python allocations only) in a second child, since tracemalloc slows allocation-heavy
code. HTA (HolisticTraceAnalysis) runs when ``--hta-python`` names an interpreter that has it (HTA is
not a dependency of this project). ``--runs N`` (N > 1) then measures shardctl N more times and prints
the medians of its peak RSS and wall time: on a set of two small ranks peak RSS moves by a few tenths of
a MB from run to run with the order of allocations alone. With ``--against DIR`` (another checkout:
``git worktree add DIR REV``) those runs take turns with DIR's code, the order flipped every other run,
and the medians of both trees print side by side. Make an HTA interpreter with::

    python3 -m venv /tmp/hta-venv && /tmp/hta-venv/bin/pip install HolisticTraceAnalysis==0.5.0
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "profiles" / "fixtures"))

from make_synthetic_gpu_traces import write_rank_traces  # type: ignore[import-not-found]  # noqa: E402
from side_by_side import add_against, compiled, trees  # noqa: E402

from service.profiles.reader import read_trace  # noqa: E402

CGROUP_ENV = "SHARDCTL_BENCH_CGROUP"

# Each child prints one JSON line: {"seconds", "rss_before", "rss_peak", "charged", ...}. RSS is read
# from /proc (VmRSS now, VmHWM peak) so the import baseline can be subtracted. With CGROUP_ENV set
# (`trace_memory_cgroup.py`: the folder of a cgroup v1 memory cgroup) the child enters that
# cgroup once its imports are done, and "charged" is the cgroup's peak charge above its charge then.
_RSS = f"""
import os, resource

CGROUP = os.environ.get({CGROUP_ENV!r})
CHARGED_BEFORE = 0


def cgroup_value(name):
    with open(os.path.join(CGROUP, name)) as fh:
        return int(fh.read())


def baseline():
    global CHARGED_BEFORE
    if CGROUP:
        with open(os.path.join(CGROUP, "cgroup.procs"), "w") as fh:
            fh.write(str(os.getpid()))
        with open(os.path.join(CGROUP, "memory.max_usage_in_bytes"), "w") as fh:
            fh.write("0")  # v1: resets the high-water mark to the charge now
        CHARGED_BEFORE = cgroup_value("memory.usage_in_bytes")
    return rss("VmRSS:")


def charged():
    return cgroup_value("memory.max_usage_in_bytes") - CHARGED_BEFORE if CGROUP else None


def cpu_with_workers():
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def worker_peak():
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024


def rss(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024
    raise RuntimeError(field)
"""

OURS_CHILD = _RSS + """
import json, sys, time, tracemalloc
sys.path.insert(0, sys.argv[1])
from service.profiles import analyze_traces
paths = sys.argv[3:]
if sys.argv[2] == "tracemalloc":
    tracemalloc.start()
    analyze_traces(paths)
    print(json.dumps({"python_peak": tracemalloc.get_traced_memory()[1]}))
else:
    before = baseline()
    t0, c0 = time.perf_counter(), cpu_with_workers()
    summary = analyze_traces(paths)
    seconds, cpu = time.perf_counter() - t0, cpu_with_workers() - c0
    print(json.dumps({"seconds": seconds, "cpu": cpu, "rss_before": before, "rss_peak": rss("VmHWM:"),
                      "charged": charged(), "bound": summary.diagnosis.bound,
                      "hta": {r: s.hta_compat.model_dump() for r, s in summary.ranks.items()}}))
"""

HTA_CHILD = _RSS + """
import json, sys, time
from hta.trace_analysis import TraceAnalysis
before = baseline()
files = {int(rank): name for rank, name in (arg.split("=", 1) for arg in sys.argv[2:])}
t0, c0 = time.perf_counter(), cpu_with_workers()
a = TraceAnalysis(trace_files=files, trace_dir=sys.argv[1])
breakdown = a.get_temporal_breakdown(visualize=False)
overlap = a.get_comm_comp_overlap(visualize=False)
seconds, cpu = time.perf_counter() - t0, cpu_with_workers() - c0
print(json.dumps({"seconds": seconds, "cpu": cpu, "rss_before": before, "rss_peak": rss("VmHWM:"),
                  "worker_peak": worker_peak(), "charged": charged(),
                  "hta": {str(r): {"idle_time_pctg": float(i), "compute_time_pctg": float(c),
                                   "non_compute_time_pctg": float(n), "comm_comp_overlap_pctg": float(o)}
                          for r, i, c, n, o in zip(breakdown["rank"], breakdown["idle_time_pctg"],
                                                   breakdown["compute_time_pctg"],
                                                   breakdown["non_compute_time_pctg"],
                                                   overlap.set_index("rank").loc[breakdown["rank"],
                                                                                 "comp_comm_overlap_pctg"])}}))
"""


GOAL_SPEEDUP = 5.0  # at least 5x faster than HTA 0.5.0 on the same traces
GOAL_MEMORY = 5.0  # ... and at most a fifth of its peak memory


def _decompressed_size(path: Path) -> int:
    with path.open("rb") as probe:
        gzipped = probe.read(2) == b"\x1f\x8b"
    with (gzip.open(path, "rb") if gzipped else path.open("rb")) as fh:
        return sum(len(chunk) for chunk in iter(lambda: fh.read(1 << 20), b""))


def _rank_of(path: Path, index: int) -> int:
    """The file's distributedInfo.rank, as shardctl reads it; the argument position if it has none."""
    meta = read_trace(path, lambda _: None)
    rank = (meta.get("distributedInfo") or {}).get("rank")
    return rank if isinstance(rank, int) else index


def trace_folder(paths: list[Path]) -> Path:
    """The one folder that holds `paths` (HTA reads a trace directory); `SystemExit` naming the fix if not."""
    if len({p.parent for p in paths}) != 1:
        raise SystemExit("--traces: put the files in one folder (HTA reads a trace directory)")
    return paths[0].parent


def hta_rank_files(paths: list[Path]) -> list[str]:
    """HTA_CHILD's arguments after the trace folder: `rank=file name`, since HTA takes ranks from the caller."""
    return [f"{_rank_of(p, index)}={p.name}" for index, p in enumerate(paths)]


def _same(a: float | None, b: float | None) -> bool:
    """Equal figures; HTA's NaN (no communication) is shardctl's None."""
    def norm(x: float | None) -> float | None:
        return None if x is None or math.isnan(x) else x

    return norm(a) == norm(b)


def _result(python: str, returncode: int, printed: str, complaint: str) -> dict[str, object]:
    """A child's last printed line, as JSON; `SystemExit` with its stderr where it failed or printed
    nothing."""
    lines = printed.strip().splitlines()
    if returncode != 0 or not lines:
        raise SystemExit(f"child {python} failed (exit {returncode}, {len(lines)} lines printed):\n"
                         f"{complaint[-3000:]}")
    out: dict[str, object] = json.loads(lines[-1])
    return out


def run_child(python: str, code: str, *args: str, env: dict[str, str] | None = None) -> dict[str, object]:
    """Run `code` (OURS_CHILD, HTA_CHILD) in a child of `python`; what it printed, as `_result` reads it."""
    res = subprocess.run([python, "-c", code, *args], capture_output=True, check=False, env=env)
    return _result(python, res.returncode, res.stdout.decode(errors="replace"), res.stderr.decode(errors="replace"))


def _descendants(pid: int) -> set[int]:
    """`pid`'s child processes and theirs, as /proc lists them now (Linux). A process or thread that
    ends while being read lists nothing; a child a thread's exit handed to another is listed once."""
    found: set[int] = set()
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            kids = [int(k) for k in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
        except OSError:
            continue
        for kid in kids:
            if kid not in found:
                found |= {kid, *_descendants(kid)}
    return found


def _private_bytes(pid: int) -> int:
    """Memory only `pid` maps (its unique set size): for a forked worker, what it added to its parent's
    pages, including those it copied on write. 0 once the process is gone."""
    try:
        lines = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
    except OSError:
        return 0
    return sum(int(line.split()[1]) * 1024 for line in lines if line.startswith(("Private_Clean:", "Private_Dirty:")))


PAGE = os.sysconf("SC_PAGE_SIZE")


def _resident_bytes(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
    except OSError:
        return 0


def _tree_peak(python: str, code: str, *args: str) -> tuple[dict[str, object], float]:
    """`_child`'s run, with the peak memory of its whole process tree above the child's RSS after its
    imports, in MB: the child's RSS plus the private memory of every process it started (HTA's forked
    parsing workers), sampled from here every 1 to 3 ms (a sample takes time), or the child's own
    `VmHWM` where that is higher. Sampling can miss a short peak, so for a tree with workers this is
    about a lower bound (the child's RSS and a worker's private memory are read one after the other,
    so a page that changes hands between the two reads can count twice). A run of its own: the
    sampling takes CPU from the child, so its time is not reported. The child and whatever it started
    are killed if the sampling stops early (an error, Ctrl-C)."""
    with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:  # files: no pipe to fill
        proc = subprocess.Popen([python, "-c", code, *args], stdout=stdout, stderr=stderr, start_new_session=True)
        highest = 0
        try:
            while proc.poll() is None:
                highest = max(highest, _resident_bytes(proc.pid) + sum(map(_private_bytes, _descendants(proc.pid))))
                time.sleep(0.001)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        stdout.seek(0)
        stderr.seek(0)
        printed, complaint = (f.read().decode(errors="replace") for f in (stdout, stderr))
    out = _result(python, proc.returncode, printed, complaint)
    return out, max(_mb(highest), _mb(out["rss_peak"])) - _mb(out["rss_before"])


def _mb(x: object) -> float:
    return float(x) / 1e6  # type: ignore[arg-type]


def _medians(measured: list[Path | None], names: list[str], runs: int) -> None:
    """Peak RSS above imports and wall time of `runs` runs of each tree in `measured` (None: this
    one), taking turns, as medians."""
    rss: list[list[float]] = [[] for _ in measured]
    wall: list[list[float]] = [[] for _ in measured]
    for run in range(runs):
        order = list(range(len(measured)))
        if run % 2:
            order.reverse()
        for i in order:
            out = run_child(sys.executable, OURS_CHILD, str(measured[i] or ROOT), "time", *names)
            rss[i].append(_mb(out["rss_peak"]) - _mb(out["rss_before"]))
            wall[i].append(float(out["seconds"]))  # type: ignore[arg-type]
    for tree, peaks, seconds in zip(measured, rss, wall, strict=True):
        print(f"{tree or 'this tree'}: median of {runs} runs: peak RSS +{statistics.median(peaks):.3f} MB over its "
              f"imports (runs: {' '.join(f'{x:.3f}' for x in peaks)}), {statistics.median(seconds):.3f} s wall")
    if len(measured) > 1:
        print(f"this tree / {measured[1]}: peak RSS {statistics.median(rss[0]) / statistics.median(rss[1]):.3f}, "
              f"wall {statistics.median(wall[0]) / statistics.median(wall[1]):.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--kernels", type=int, default=500, help="kernels per step")
    ap.add_argument("--dir", type=Path, default=None, help="where to write the synthetic traces")
    ap.add_argument("--traces", type=Path, nargs="+", help="analyse these files (one per rank) instead")
    ap.add_argument("--hta-python", default=None, help="an interpreter with HolisticTraceAnalysis installed")
    ap.add_argument("--runs", type=int, default=1, help="then measure shardctl this many times, as medians")
    add_against(ap, "--runs takes turns between this tree and DIR")
    args = ap.parse_args()
    measured = trees(ap, args.against)
    if args.against is not None and args.runs < 2:
        ap.error("--against needs --runs N with N >= 2: one run of a small set is within its noise")
    if args.traces:
        paths = [p.resolve() for p in args.traces]
        trace_dir = trace_folder(paths)
    else:
        trace_dir = args.dir or Path(tempfile.mkdtemp(prefix="shardctl-profile-bench-"))
        paths = write_rank_traces(trace_dir, world=args.ranks, steps=args.steps, kernels_per_step=args.kernels)
    on_disk = sum(p.stat().st_size for p in paths)
    largest = max(_decompressed_size(p) for p in paths)
    print(f"trace set: {len(paths)} ranks, {on_disk / 1e6:.1f} MB on disk, largest rank {largest / 1e6:.1f} MB "
          f"of JSON, in {trace_dir}")

    names = [str(p) for p in paths]
    for tree in measured:
        compiled(tree or ROOT)
    load_before = os.getloadavg()[0]
    ours = run_child(sys.executable, OURS_CHILD, str(ROOT), "time", *names)
    python_peak = run_child(sys.executable, OURS_CHILD, str(ROOT), "tracemalloc", *names)["python_peak"]
    ours_mem = _mb(ours["rss_peak"]) - _mb(ours["rss_before"])
    print(f"shardctl: {ours['seconds']:.2f} s wall, {ours['cpu']:.2f} s CPU, "
          f"peak RSS +{ours_mem:.1f} MB over its imports "
          f"(Python allocations peak {_mb(python_peak):.1f} MB = {_mb(python_peak) * 1e6 / largest:.2f}x the "
          f"largest rank's JSON; ranks are analysed one at a time); verdict {ours['bound']}")

    if not args.hta_python:
        print(f"HTA: not run (pass --hta-python with an interpreter that has HolisticTraceAnalysis); "
              f"background load (1-min load average) {load_before:.1f} on {os.cpu_count()} CPUs")
    else:
        _against_hta(args.hta_python, trace_dir, paths, ours, ours_mem, load_before)
    if args.runs > 1:
        _medians(measured, names, args.runs)


def verdict(ratio: float, goal: float) -> str:
    return "met" if ratio >= goal else "missed"


def _against_hta(hta_python: str, trace_dir: Path, paths: list[Path], ours: dict[str, object], ours_mem: float,
                 load_before: float) -> None:
    pairs = hta_rank_files(paths)
    hta = run_child(hta_python, HTA_CHILD, str(trace_dir), *pairs)
    hta_mem = _mb(hta["rss_peak"]) - _mb(hta["rss_before"])
    workers = _mb(hta["worker_peak"])
    print(f"HTA 0.5.0: {hta['seconds']:.2f} s wall, {hta['cpu']:.2f} s CPU (its parsing workers included), "
          f"peak RSS +{hta_mem:.1f} MB over its imports"
          + (f"; its largest parsing worker also peaked at {workers:.1f} MB RSS, not counted here" if workers else ""))
    wall = float(hta["seconds"]) / float(ours["seconds"])  # type: ignore[arg-type]
    cpu = float(hta["cpu"]) / float(ours["cpu"])  # type: ignore[arg-type]
    memory = hta_mem / max(ours_mem, 0.1)
    print(f"HTA / shardctl: time {wall:.2f}x wall, {cpu:.2f}x CPU (goal >= {GOAL_SPEEDUP:g}x: "
          f"{verdict(min(wall, cpu), GOAL_SPEEDUP)}); peak memory of the child alone {memory:.2f}x "
          f"(HTA's parsing workers left out: a part of HTA's peak)")
    _, hta_tree = _tree_peak(hta_python, HTA_CHILD, str(trace_dir), *pairs)
    _, ours_tree = _tree_peak(sys.executable, OURS_CHILD, str(ROOT), "time", *(str(p) for p in paths))
    tree = hta_tree / max(ours_tree, ours_mem, 0.1)  # ours: the higher of its two runs
    print(f"whole process trees (a run each, sampled every 1-3 ms: the child's RSS and its workers' private memory, "
          f"what they copied on write included, above the child's imports): HTA +{hta_tree:.1f} MB, "
          f"shardctl +{ours_tree:.1f} MB: {tree:.2f}x, the memory goal's figure "
          f"(goal >= {GOAL_MEMORY:g}x, i.e. at most a fifth of HTA's peak: {verdict(tree, GOAL_MEMORY)})")
    print(f"background load (1-min load average): {load_before:.1f} before, {os.getloadavg()[0]:.1f} after, "
          f"on {os.cpu_count()} CPUs; CPU-time ratios are the steadier under load")
    keys = ("idle_time_pctg", "compute_time_pctg", "non_compute_time_pctg", "comm_comp_overlap_pctg")
    ours_hta: dict[str, dict[str, float]] = ours["hta"]  # type: ignore[assignment]
    theirs: dict[str, dict[str, float]] = hta["hta"]  # type: ignore[assignment]
    differ = [(r, k, ours_hta[r][k], theirs[r][k]) for r in sorted(theirs, key=int) for k in keys
              if not _same(ours_hta[r][k], theirs[r][k])]
    print(f"hta_compat vs HTA on {len(theirs)} ranks x {len(keys)} figures: "
          + ("all equal" if not differ else f"{len(differ)} differ: {differ}"))


if __name__ == "__main__":
    main()
