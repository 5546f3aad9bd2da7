"""The evidence a failed job leaves: a tail of each node's submitit log files.

submitit writes `<job folder>/<slurm id>_<task>_log.{out,err}`, one task per node (torchrun writes all
local ranks of a node to that node's files). `log_tail` is what `poll` attaches to a FAILED
observation; it only reads files, so a missing or unreadable folder gives None, never an error.
"""

from __future__ import annotations

import re
from pathlib import Path

from workers.backends import jobfiles
from workers.backends.evidence import program_lines

LOG_TAIL_LINES = 30
LOG_TAIL_CHARS = 8000
#: Bytes read from the end of each log file for its tail (the job may write without bound).
LOG_TAIL_READ = 256 * 1024

#: lines that are not the program's: submitit's own INFO/WARNING lines, C++ stack frames, glog noise
_NOISE = re.compile(r"submitit (INFO|WARNING)|^frame #\d+|^<omitting python frames>|^Exception raised from"
                    r"|^[EW]\d{4} |^\[W\d{4}|^Exception ignored in")


def log_files(folder: Path, job_id: str | None, task: int | None = None) -> list[Path]:
    """The log files of job `job_id` (any id when None) in `folder`, of `task` (every task when None),
    by task, stderr before stdout."""
    if not folder.is_dir():
        return []
    pattern = f"{job_id or '*'}_{'*' if task is None else task}_log."
    files = sorted(folder.glob(pattern + "err")) + sorted(folder.glob(pattern + "out"))
    return sorted(files, key=lambda p: (p.name.split("_")[1], p.suffix != ".err"))


def log_tail(folder: Path, job_id: str | None, lines: int = LOG_TAIL_LINES) -> str | None:
    """The last `lines` lines of each node's stdout and of its stderr, headed `[node <task> <stream>]`.

    Noise (`_NOISE`) and torchrun's own lines (`evidence.program_lines`: its traceback and failure
    summary) are left out; the node whose torchrun
    reported the root cause comes first. At most `LOG_TAIL_CHARS` characters (the last ones); None
    when there is nothing to show."""
    parts: list[tuple[str, str, list[str]]] = []
    root_tasks: set[str] = set()
    for path in log_files(folder, job_id):
        task = path.name.split("_")[1]
        try:
            raw = jobfiles.read_end(path, LOG_TAIL_READ).decode(errors="replace")
        except OSError:
            continue
        kept = [ln for ln in raw.splitlines() if ln.strip() and not _NOISE.search(ln)]
        text = program_lines(kept)  # torchrun's traceback, exception line and failure summary left out too
        if text:
            if any("Root Cause" in ln for ln in kept):
                root_tasks.add(task)
            parts.append((task, "stdout" if path.suffix == ".out" else "stderr", text[-lines:]))
    if not parts:
        return None
    parts.sort(key=lambda p: (p[0] not in root_tasks, p[0], p[1] == "stderr"))
    return "\n".join(f"[node {task} {stream}]\n" + "\n".join(text) for task, stream, text in parts)[-LOG_TAIL_CHARS:]


def drop_launcher_tracebacks(lines: list[str]) -> list[str]:
    """Remove torchrun's own Python tracebacks (those ending in a torch.distributed error), keeping the
    exception line and the program's tracebacks: a log tail should show the program, not the launcher."""
    out: list[str] = []
    buffered: list[str] | None = None
    for line in lines:
        if line.startswith("Traceback (most recent call last)"):
            if buffered:
                out += buffered
            buffered = [line]
        elif buffered is not None:
            if line.startswith(("srun:", "slurmstepd", "shardctl:")):  # interleaved from other writers
                out.append(line)
                continue
            if line.startswith((" ", "\t")):
                buffered.append(line)
                continue
            if "torch.distributed" not in line and "ChildFailedError" not in line:
                out += buffered
            buffered = None
            out.append(line)
        else:
            out.append(line)
    return out + (buffered or [])
