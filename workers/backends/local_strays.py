"""One writer per checkpoint folder: the processes a local attempt leaves behind when its supervisor dies.

A local attempt's supervisor (`local_supervisor`) is the parent of its torchrun agents, and torchrun's
ranks run in sessions of their own. When the supervisor is killed, its agents and their ranks go on
running as orphans: nothing in the attempt folder records them, and neither its process group nor its
process tree reaches them any more. They are found instead by what every process of an attempt
carries in its environment from its start (`/proc/<pid>/environ`): the job's checkpoint folder
(`SHARDCTL_CHECKPOINT_DIR`, one per job and backend folder, so two servers on one machine never
match each other's jobs) and the attempt's number (`SHARDCTL_ATTEMPT`).

- `LocalBackend.poll` stops the processes of an attempt it reports `lost`, at once.
- A new attempt's supervisor stops every process of an earlier attempt of the same job before it
  starts anything, waits until they are gone, and then holds the checkpoint folder's writer lock
  (`WRITER_LOCK`, an exclusive `flock` that its agents inherit) for as long as any of its processes
  runs, so that at most one attempt of a job runs, and writes checkpoints, at any moment.

Only processes of this server's own user are seen (another user's environment cannot be read).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import stat
import time
from pathlib import Path

from service.jobenv import ATTEMPT, CHECKPOINT_DIR

#: The lock file in a job's checkpoint folder that the running attempt holds.
WRITER_LOCK = ".writer.lock"
#: How long a new attempt waits for an earlier one's processes to be gone.
STOP_WAIT_S = 30.0


def alive(pid: int) -> bool:
    """Whether `pid` runs: it exists and is not a zombie (exited, not yet reaped by its parent)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[-1][:1] != "Z"
    except OSError:
        return False


def _environment(pid: int) -> dict[bytes, bytes] | None:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:  # gone, or another user's
        return None
    out: dict[bytes, bytes] = {}
    for entry in raw.split(b"\0"):
        key, sep, value = entry.partition(b"=")
        if sep:
            out[key] = value
    return out


def processes(checkpoint_dir: Path, *, attempt: int | None = None, other_than: int | None = None) -> list[int]:
    """The live processes started for the job whose checkpoint folder is `checkpoint_dir`: of attempt
    `attempt` only when given, of every attempt but `other_than` when given. Never this process."""
    want = str(checkpoint_dir).encode()
    me = os.getpid()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        env = _environment(int(entry.name))
        if env is None or env.get(CHECKPOINT_DIR.encode()) != want:
            continue
        number = env.get(ATTEMPT.encode(), b"")
        if attempt is not None and number != str(attempt).encode():
            continue
        if other_than is not None and number == str(other_than).encode():
            continue
        if alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def kill(pids: list[int]) -> None:
    """SIGKILL each of `pids` (those already gone are skipped)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def stop_earlier(checkpoint_dir: Path, attempt: int, *, wait_s: float = STOP_WAIT_S) -> list[int]:
    """SIGKILL every process of an attempt of this job other than `attempt`, and wait until none is left
    (zombies count as gone). Returns the processes that were found; `TimeoutError` when some still run
    after `wait_s`."""
    found = processes(checkpoint_dir, other_than=attempt)
    deadline = time.monotonic() + wait_s
    left = found
    while left:
        kill(left)
        time.sleep(0.05)
        left = processes(checkpoint_dir, other_than=attempt)
        if left and time.monotonic() > deadline:
            raise TimeoutError(f"processes {left} of an earlier attempt still run after SIGKILL")
    return found


def _open_lock(path: Path) -> int:
    """The lock file, opened without blocking or following a link; anything but a regular file there (the
    job can write this folder) is removed and a fresh one made."""
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, 0o600)
    except OSError:  # a link (ELOOP) or something that will not open: replace it
        path.unlink(missing_ok=True)
        return os.open(path, flags | os.O_EXCL, 0o600)
    if stat.S_ISREG(os.fstat(fd).st_mode):
        return fd
    os.close(fd)
    path.unlink()
    return os.open(path, flags | os.O_EXCL, 0o600)


def hold_writer_lock(checkpoint_dir: Path, *, wait_s: float = STOP_WAIT_S) -> int:
    """The checkpoint folder's writer lock, held: a file descriptor with an exclusive `flock`, to pass to
    the attempt's processes so that the lock lasts as long as any of them. `TimeoutError` when another
    process holds it for `wait_s`."""
    fd = _open_lock(checkpoint_dir / WRITER_LOCK)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                raise TimeoutError("another process holds the checkpoint folder's writer lock") from None
            time.sleep(0.1)


__all__ = ["STOP_WAIT_S", "WRITER_LOCK", "alive", "hold_writer_lock", "kill", "processes", "stop_earlier"]
