"""`benchmarks/profile_analyze.py`'s whole-tree peak: what the HTA comparison's second memory ratio
stands on. A forked worker's copies on write are memory the tool added; pages it only shares with its
parent are not."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
MB = 64

# Prints what the benchmark's children print: RSS after the "imports" (here: a 64 MB buffer made
# before the fork) and the process's own peak; a forked worker writes to every page of the buffer, or
# only reads it, and holds on for a second so that the sampling sees it.
_CHILD = """
import json, multiprocessing, sys, time

def rss(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024

buffer = bytearray(int(sys.argv[2]) << 20)
for start in range(0, len(buffer), 1 << 20):  # every page written, no temporary copy
    buffer[start:start + (1 << 20)] = b"x" * (1 << 20)
before = rss("VmRSS:")

def worker(write):
    if write:
        for i in range(0, len(buffer), 4096):
            buffer[i] = 1
    else:
        sum(buffer[i] for i in range(0, len(buffer), 4096))
    time.sleep(1.0)

proc = multiprocessing.get_context("fork").Process(target=worker, args=(sys.argv[1] == "write",))
proc.start()
proc.join()
print(json.dumps({"rss_before": before, "rss_peak": rss("VmHWM:")}))
"""


@pytest.fixture(scope="module")
def profile_analyze() -> ModuleType:
    if not Path("/proc/self/smaps_rollup").exists():
        pytest.skip("the whole-tree peak reads /proc/PID/smaps_rollup (Linux 4.14 or later)")
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(BENCHMARKS))  # the benchmarks import each other by their bare names
        import profile_analyze as module
    return module


def test_a_workers_copies_on_write_count(profile_analyze: ModuleType) -> None:
    out, peak = profile_analyze._tree_peak(sys.executable, _CHILD, "write", str(MB))
    own = (int(out["rss_peak"]) - int(out["rss_before"])) / 1e6  # type: ignore[call-overload]
    assert own < 8, "the parent itself grew: the test no longer isolates the worker"
    assert peak >= 0.9 * MB * 1.048576, f"the worker's {MB} MB of copies should count, got +{peak:.1f} MB"


def test_pages_a_worker_only_shares_do_not_count(profile_analyze: ModuleType) -> None:
    _, peak = profile_analyze._tree_peak(sys.executable, _CHILD, "read", str(MB))
    assert peak < 16, f"a worker that only reads its parent's {MB} MB added +{peak:.1f} MB"


def test_a_failing_child_is_reported(profile_analyze: ModuleType) -> None:
    with pytest.raises(SystemExit, match="ZeroDivisionError"):
        profile_analyze._tree_peak(sys.executable, "1/0")


def test_a_child_that_writes_much_is_read_to_the_end(profile_analyze: ModuleType) -> None:
    """HTA logs to stderr: a child that writes more than a pipe holds must not stall while sampled."""
    code = "import sys; sys.stderr.write('x' * 500_000); print('{\"rss_before\": 0, \"rss_peak\": 0}')"
    result: list[Any] = []
    worker = threading.Thread(target=lambda: result.append(profile_analyze._tree_peak(sys.executable, code)),
                              daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), "the child stalled on a full pipe"
    assert result[0][0] == {"rss_before": 0, "rss_peak": 0}
