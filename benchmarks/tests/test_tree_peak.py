"""`benchmarks/profile_analyze.py`'s whole-tree peak: what the HTA comparison's second memory ratio
stands on. A forked worker's copies on write are memory the tool added; pages it only shares with its
parent are not."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1]
MB = 64

# Prints what the benchmark's children print: RSS after the "imports" (here: a 64 MB buffer made
# before the fork) and the process's own peak; a forked worker writes to every page of the buffer, or
# only reads it, or forks a worker of its own that writes, and holds on for a second so that the
# sampling sees it.
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

def worker(mode):
    if mode == "nested":
        inner = multiprocessing.get_context("fork").Process(target=worker, args=("write",))
        inner.start()
        inner.join()
        return
    if mode == "write":
        for i in range(0, len(buffer), 4096):
            buffer[i] = 1
    else:
        sum(buffer[i] for i in range(0, len(buffer), 4096))
    time.sleep(1.0)

proc = multiprocessing.get_context("fork").Process(target=worker, args=(sys.argv[1],))
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


@pytest.mark.parametrize("mode", ["write", "nested"])
def test_a_workers_copies_on_write_count(profile_analyze: ModuleType, mode: str) -> None:
    out, peak = profile_analyze._tree_peak(sys.executable, _CHILD, mode, str(MB))
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
    assert result and result[0][0] == {"rss_before": 0, "rss_peak": 0}


def test_a_child_that_prints_nothing_is_reported(profile_analyze: ModuleType) -> None:
    with pytest.raises(SystemExit, match="0 lines printed"):
        profile_analyze._tree_peak(sys.executable, "import sys; sys.stderr.buffer.write(b'\\xff not UTF-8')")


def test_the_tree_is_killed_when_sampling_stops_early(profile_analyze: ModuleType, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C or an error in the sampling must not leave the tool and its workers running."""
    pids = tmp_path / "pids"
    code = ("import os, subprocess, sys, time\n"
            "sleeper = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
            f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{sleeper.pid}}')\n"
            "time.sleep(60)\n")

    def interrupted(pid: int) -> int:
        if not pids.exists() or len(pids.read_text().split()) < 2:
            return 0
        raise KeyboardInterrupt

    monkeypatch.setattr(profile_analyze, "_resident_bytes", interrupted)
    with pytest.raises(KeyboardInterrupt):
        profile_analyze._tree_peak(sys.executable, code)
    for pid in map(int, pids.read_text().split()):
        for _ in range(100):  # SIGKILL is delivered asynchronously
            if not _running(pid):
                break
            time.sleep(0.05)
        assert not _running(pid), f"process {pid} outlived the sampling"


def _running(pid: int) -> bool:
    """Neither gone nor a zombie waiting for its parent to collect it."""
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
