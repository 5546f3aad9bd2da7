"""Where trace analysis spends memory and time, stage by stage and rank by rank: the diagnosis behind
`profile_analyze.py`'s figures (results in benchmarks/results/trace_stages.md).

Usage::

    .venv/bin/python benchmarks/trace_stages.py --traces FILES [--tree DIR]
    .venv/bin/python benchmarks/trace_stages.py --traces FILES --cpu 15
    .venv/bin/python benchmarks/trace_stages.py --traces FILES --numpy-blocks

Runs `analyze_traces` once in this process, after its imports, with each stage of a rank wrapped
(`analyze.py`'s names: the read, `hta_compat`, the timeline, the launch statistics, the collectives,
the rank summary, the trim). After each stage it prints the process's RSS above its RSS after the
imports, the peak since the rank began (`VmHWM`, reset per rank through `/proc/self/clear_refs`;
Linux), and the C heap's size and bytes in use (glibc's `mallinfo2`; blank elsewhere). The trim
lowers RSS by madvise, which the kernel's peak does not always record: read peaks from
`profile_analyze.py`.

``--cpu N``: instead, N more analyses after a first, and the best and median CPU time of one
(`time.process_time`). ``--numpy-blocks``: instead, which 64 KB blocks of numpy's
``_multiarray_umath`` code the analysis reads in that the imports did not, and the source lines of
`service/profiles` that use each (after every line, the blocks' present bits from
`/proc/self/pagemap`, then ``madvise(MADV_DONTNEED)`` on the library's code, so that each line shows
every block it uses, not only its new ones; the kernel maps a library's code in such blocks). It runs
the analysis under a line tracer: minutes on a large set. ``--tree DIR`` measures another checkout's
`service` (`git worktree add DIR REV`); run each tree in its own invocation and compare. The tree's
`service` is compiled to bytecode first, as `profile_analyze.py` does and for its reason: compiling at
import leaves freed heap that the analysis reuses, which made a tree without `__pycache__` read lower.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from side_by_side import compiled

ROOT = Path(__file__).resolve().parents[1]
_STAGES = ("load_rank_trace", "hta_compat_for_rank", "build_timeline", "launch_stats", "collect_instances",
           "collective_stats", "rank_summary", "release_free_heap")
_BLOCK = 64 * 1024
_PAGE = os.sysconf("SC_PAGE_SIZE")


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]


def _status(field: str) -> int:
    """A `/proc/self/status` figure in KB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(field)


def _heap() -> str:
    """The C heap's size and bytes in use, in KB (glibc only)."""
    info = getattr(ctypes.CDLL(None), "mallinfo2", None)
    if info is None:
        return ""
    info.restype = _MallInfo2
    got = info()
    return f"heap {(got.arena + got.hblkhd) // 1024:6d} KB, in use {(got.uordblks + got.hblkhd) // 1024:6d} KB"


def _stages(paths: list[Path]) -> None:
    from service.profiles import analyze

    base, anon, files = _status("VmRSS"), _status("RssAnon"), _status("RssFile")
    print(f"after imports: RSS {base} KB, {_heap()}")

    def reset_peak() -> None:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")

    def wrap(name: str) -> None:
        stage: Callable[..., Any] = getattr(analyze, name)

        def measured(*args: Any, **kwargs: Any) -> Any:
            if name == "load_rank_trace":
                reset_peak()
                print(f"rank from {args[0]}:")
            t0 = time.process_time()
            out = stage(*args, **kwargs)
            cpu = (time.process_time() - t0) * 1e3
            print(f"  {name:19s} {cpu:6.1f} ms CPU  RSS +{_status('VmRSS') - base:5d} KB (anonymous "
                  f"+{_status('RssAnon') - anon:5d}, files +{_status('RssFile') - files:5d})  peak since the rank "
                  f"began +{_status('VmHWM') - base:5d} KB  {_heap()}")
            return out

        setattr(analyze, name, measured)

    for name in _STAGES:
        wrap(name)
    analyze.analyze_traces(paths)
    print(f"after the analysis: RSS +{_status('VmRSS') - base} KB, {_heap()}")


def _cpu(paths: list[Path], runs: int) -> None:
    from service.profiles import analyze_traces

    analyze_traces(paths)  # the first run reads code and data in
    times = []
    for _ in range(runs):
        t0 = time.process_time()
        analyze_traces(paths)
        times.append((time.process_time() - t0) * 1e3)
    print(f"{runs} analyses: best {min(times):.1f} ms CPU, median {statistics.median(times):.1f} ms")


def _numpy_blocks(paths: list[Path]) -> None:
    from service.profiles import analyze_traces  # imports numpy

    library = str(Path(str(sys.modules["numpy._core._multiarray_umath"].__file__)).resolve())
    code = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split()
            if len(parts) > 5 and parts[5] == library and "x" in parts[1]:
                start, end = (int(x, 16) for x in parts[0].split("-"))
                code.append((start, end))
    madvise = ctypes.CDLL(None, use_errno=True).madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    pagemap = os.open("/proc/self/pagemap", os.O_RDONLY)

    def present() -> set[int]:
        blocks: set[int] = set()
        for start, end in code:
            n = (end - start) // _PAGE
            entries = os.pread(pagemap, n * 8, start // _PAGE * 8)
            blocks.update((start + i * _PAGE) // _BLOCK for i in range(n) if entries[i * 8 + 7] & 0x80)
        return blocks

    def drop() -> None:
        for start, end in code:
            madvise(start, end - start, 4)  # MADV_DONTNEED: the next use maps its block again

    uses: dict[tuple[str, int], set[int]] = collections.defaultdict(set)
    last: list[tuple[str, int] | None] = [None]

    def tracer(frame: FrameType, event: str, arg: object) -> Callable[..., Any] | None:
        if f"{os.sep}profiles{os.sep}" not in frame.f_code.co_filename:
            return None
        if event in ("line", "return"):
            if last[0] is not None:
                uses[last[0]] |= present()
            drop()
            last[0] = (Path(frame.f_code.co_filename).name, frame.f_lineno) if event == "line" else None
        return tracer

    imported = present()
    drop()
    sys.settrace(tracer)
    try:
        analyze_traces(paths)
    finally:
        sys.settrace(None)
    lines_of: dict[int, set[tuple[str, int]]] = collections.defaultdict(set)
    for at, blocks in uses.items():
        for block in blocks - imported:
            lines_of[block].add(at)
    print(f"{library}: {len(imported)} blocks of 64 KB touched by the imports; the analysis reads in "
          f"{len(lines_of)} more ({len(lines_of) * 64} KB). Each, with the lines that use it:")
    for block, lines in sorted(lines_of.items(), key=lambda item: len(item[1])):
        shown = ", ".join(f"{name}:{number}" for name, number in sorted(lines)[:8])
        print(f"  {block * _BLOCK:#x}: {len(lines)} lines: {shown}{', ...' if len(lines) > 8 else ''}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", type=Path, nargs="+", required=True, help="one trace file per rank")
    ap.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose service/ to measure")
    what = ap.add_mutually_exclusive_group()
    what.add_argument("--cpu", type=int, metavar="N", help="CPU time of N analyses instead")
    what.add_argument("--numpy-blocks", action="store_true", help="numpy's code blocks per line instead")
    args = ap.parse_args()
    if not (args.tree / "service" / "profiles").is_dir():
        ap.error(f"--tree {args.tree}: no service/profiles there (make one with git worktree add DIR REV)")
    compiled(args.tree)
    sys.path.insert(0, str(args.tree.resolve()))
    paths: list[Path] = args.traces
    if args.cpu:
        _cpu(paths, args.cpu)
    elif args.numpy_blocks:
        _numpy_blocks(paths)
    else:
        _stages(paths)


if __name__ == "__main__":
    main()
