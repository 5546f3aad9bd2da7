"""Preempting a local attempt with notice: SIGTERM now, SIGKILL after the grace period.

The service asks (`request`): it writes `preempt.json` (`{"grace_s", "requested_at"}`) into the
attempt folder and sends SIGTERM to the supervisor (`signal_supervisor`). The detached supervisor does
the rest, so the service may restart meanwhile: it forwards SIGTERM to its agents, once each (torchrun passes
it on to every rank; the built-in runtime then finishes its step, writes a checkpoint and exits
with `service.jobenv.PREEMPTED_EXIT_CODE`), and if anything of the attempt is still alive
`grace_s` later, it SIGKILLs every process below it (`kill_descendants`: torchrun's ranks run in
sessions of their own, so a process group alone does not reach them).

The attempt then ends as preempted (`exit.json` `"preempted": true`) whenever it was asked to stop
this way and did not succeed, or a rank exited with the preempted code by itself; a program that
ignores SIGTERM is preempted all the same, it only loses the work since its last checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from pathlib import Path

from pydantic import BaseModel, Field

from workers.backends import jobfiles

PREEMPT_FILE = "preempt.json"


class PreemptRequest(BaseModel):
    """`<attempt folder>/preempt.json`: the notice the attempt was given."""

    grace_s: float = Field(ge=0)
    requested_at: float


def request(attempt: Path, grace_s: float) -> bool:
    """Record the notice (the first one stands: a repeated request does not restart the grace period)
    and signal the supervisor (`signal_supervisor`). Repeating it is safe, and is how a notice lost
    to a crash between the two is given again. False when the attempt is over or unknown."""
    if not attempt.exists() or (attempt / "exit.json").exists():
        return False
    body = PreemptRequest(grace_s=grace_s, requested_at=time.time()).model_dump_json()
    with contextlib.suppress(FileExistsError):
        fd = os.open(attempt / PREEMPT_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(body)
    signal_supervisor(attempt)  # not started yet: it reads preempt.json before it starts anything
    return True


def signal_supervisor(attempt: Path) -> None:
    """SIGTERM to the attempt's supervisor alone (a cancel's or a notice's), which passes it on to
    each of its children once: the agents' process group is not signalled, because torchrun's agent
    exits at once on a second SIGTERM and leaves its ranks behind. Nothing when the supervisor has
    not written its pid yet."""
    try:
        pid = int(json.loads(jobfiles.read_small_text(attempt / "state.json"))["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)


def requested(attempt: Path) -> PreemptRequest | None:
    """The notice given to `attempt`, if any."""
    try:
        return PreemptRequest.model_validate_json(jobfiles.read_small_text(attempt / PREEMPT_FILE))
    except (OSError, ValueError):
        return None


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (children, theirs, ...), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(") ", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    out: list[int] = []
    todo = list(children.get(pid, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def kill_descendants(pid: int) -> None:
    """SIGKILL every process below `pid`, the deepest found first."""
    for p in reversed(descendants(pid)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, signal.SIGKILL)


def arm_deadline(attempt: Path) -> None:
    """In the supervisor, on SIGTERM: when the attempt was given a preemption notice, SIGKILL whatever
    of it still runs once the grace period is over (a daemon timer; the supervisor waits for its
    children meanwhile)."""
    notice = requested(attempt)
    if notice is None:
        return
    remaining = max(0.0, notice.requested_at + notice.grace_s - time.time())
    timer = threading.Timer(remaining, kill_descendants, args=(os.getpid(),))
    timer.daemon = True
    timer.start()


def ended_preempted(attempt: Path, codes: list[int]) -> bool:
    """Whether the attempt's end counts as a preemption: it had notice and did not succeed. Exit code 75
    without notice is the program's own (EX_TEMPFAIL is common): a program error, never a preemption,
    which would requeue it at once and without counting, for ever."""
    return any(c != 0 for c in codes) and requested(attempt) is not None
