"""Failure evidence in a run's own output, the same for every backend (pure: text in, facts out).

- `root_cause_exit_code`: the program's exit code from torchrun's failure summary. torchrun itself
  exits 1 whatever its ranks did; its summary's "Root Cause (first observed failure)" block names the
  first rank that failed and its `exitcode` (negative: killed by that signal). That summary is written
  for every program, while torchrun's per-rank error files (`TORCHELASTIC_ERROR_FILE`) exist only for
  programs that opt in with `@record`, so the summary is the robust source.
- `program_lines`: the lines a program printed, without its launcher's: torchrun's banner, its
  `W1201 ...`/`E1201 ...` log lines, its own Python traceback (ending in `ChildFailedError`) and the
  failure summary, submitit's INFO lines and C++ frames.
- `memory_failure`: the runtime's own out-of-memory line (`service.failures.oom_line`, which names the
  class and the measured peak) decides; otherwise a CUDA out-of-memory message is `oom_gpu`, a Python
  `MemoryError` or a C++ `std::bad_alloc` is `oom_host`.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterable

from service.failures import FailureClass, measured_oom

_ROOT_CAUSE = "Root Cause (first observed failure)"
_EXITCODE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
#: torchrun's and glog's own lines: `W1201 00:30:45.395000 9274 torch/...]`, the OMP banner
_LAUNCHER_LINE = re.compile(r"^\[?[EWIF]\d{4} \d\d:\d\d:\d\d|^\*{20,}$|^Setting OMP_NUM_THREADS environment variable"
                            r"|submitit (INFO|WARNING)|^frame #\d+|^<omitting python frames>"
                            r"|^Exception raised from|^Exception ignored in")
_GPU_OOM = re.compile(r"CUDA out of memory|torch\.(cuda\.)?OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED"
                      r"|HIP out of memory|cudaErrorMemoryAllocation")
_HOST_OOM = re.compile(r"(^|[\s:\]])MemoryError\b|std::bad_alloc")


def root_cause_exit_code(text: str) -> int | None:
    """The `exitcode` of the root-cause rank in torchrun's failure summary; None without a summary."""
    at = text.rfind(_ROOT_CAUSE)
    if at < 0:
        return None
    for line in text[at:].splitlines():
        match = _EXITCODE.match(line)
        if match:
            return int(match.group(1))
    return None


def program_lines(lines: Iterable[str]) -> list[str]:
    """`lines` without the launcher's (see the module's docstring) and without blank lines."""
    kept: list[str] = []
    traceback: list[str] | None = None
    in_summary = False
    for line in lines:
        if in_summary:
            in_summary = not line.startswith("=" * 20)  # the summary ends with a second rule
            continue
        if traceback is not None:
            if line.startswith((" ", "\t")):
                traceback.append(line)
                continue
            if "torch.distributed" not in line and "ChildFailedError" not in line:
                kept += [*traceback, line]  # the program's own traceback: keep it
            traceback = None
            continue
        if line.startswith("Traceback (most recent call last)"):
            traceback = [line]
        elif line.startswith("=" * 20):
            in_summary = True
        elif line.strip() and not _LAUNCHER_LINE.search(line):
            kept.append(line)
    return kept + (traceback or [])


def memory_failure(text: str) -> FailureClass | None:
    """`oom_gpu` or `oom_host` when the program's output shows it ran out of that memory, else None. The
    runtime's own line (`service.failures.oom_line`) wins: a rank over its per-process budget on `cpu` is
    `oom_gpu` (the plan's device), whatever else the tail shows."""
    measured = measured_oom(text)
    if measured is not None:
        return measured.failure
    if _GPU_OOM.search(text):
        return FailureClass.OOM_GPU
    if any(_HOST_OOM.search(line) for line in text.splitlines()):
        return FailureClass.OOM_HOST
    return None


def signal_name(code: int) -> str | None:
    """`SIGKILL` for -9 or 137 (128 + 9, a shell's way of saying it); None for a plain exit code."""
    number = -code if code < 0 else code - 128 if 128 < code < 160 else 0
    try:
        return signal.Signals(number).name if number else None
    except ValueError:
        return None
