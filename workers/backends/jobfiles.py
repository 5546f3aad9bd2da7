"""Reading files that a job can write: every one is hostile input.

A job's program runs as a user that can replace anything in its run folder (a node log, `state.json`,
an artifact) with a FIFO, a device, a symbolic link or a file that never stops growing. Every read of
such a file goes through this module, which:

- opens without blocking (`O_NONBLOCK`: a FIFO with no writer, or a tty, does not stall the open)
  and without following a symbolic link in the last component (`O_NOFOLLOW`);
- accepts only a regular file (`fstat` on the open descriptor, so a swap between a check and the open
  changes nothing) and answers `NotRegular` otherwise;
- reads at most the bytes asked for, with `pread` (no seek on a descriptor that cannot seek);
- runs in a small pool of its own threads and gives up after `TIMEOUT_S` (a file on a shared file
  system that stopped answering): the caller gets `JobFileTimeout`, never a hang. A thread stuck on
  such a file stays stuck, but at most `POOL_SIZE` of them, and later reads time out instead of
  queueing without end.

`OSError` covers all three failures (`NotRegular` and `JobFileTimeout` are subclasses), so a caller that
treats an unreadable file as absent catches `OSError` alone.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import TypeVar

#: Seconds one read may take before the caller stops waiting for it.
TIMEOUT_S = 5.0
#: Threads reading job files at once (each read holds one; a read stuck on a dead file system keeps it).
POOL_SIZE = 8
_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC

_pool = ThreadPoolExecutor(max_workers=POOL_SIZE, thread_name_prefix="jobfiles")
T = TypeVar("T")


class NotRegular(OSError):
    """The path is not a regular file (a FIFO, a device, a socket, a folder or a symbolic link)."""


class JobFileTimeout(OSError):
    """Reading the file took longer than `TIMEOUT_S`."""


def _bounded(fn: Callable[[], T], path: Path, timeout_s: float | None) -> T:
    limit = TIMEOUT_S if timeout_s is None else timeout_s
    future = _pool.submit(fn)
    try:
        return future.result(timeout=limit)
    except FutureTimeout:
        future.cancel()
        raise JobFileTimeout(f"reading {path.name} took over {limit} s") from None


def _open(path: Path) -> tuple[int, int]:
    """A descriptor of the regular file `path` and its size; `NotRegular` for anything else."""
    try:
        fd = os.open(path, _FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # the last component is a symbolic link
            raise NotRegular(f"{path.name} is a symbolic link") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegular(f"{path.name} is not a regular file")
        return fd, st.st_size
    except BaseException:
        os.close(fd)
        raise


def _read_at(path: Path, offset: int | None, max_bytes: int) -> tuple[bytes, int]:
    """`offset` None: the last `max_bytes` bytes."""
    fd, size = _open(path)
    if offset is None:
        offset = max(0, size - max_bytes)
    try:
        chunks: list[bytes] = []
        want, pos = max_bytes, offset
        while want > 0:
            chunk = os.pread(fd, want, pos)
            if not chunk:
                break
            chunks.append(chunk)
            want -= len(chunk)
            pos += len(chunk)
        return b"".join(chunks), size
    finally:
        os.close(fd)


def read_at(path: Path, offset: int, max_bytes: int, *, timeout_s: float | None = None) -> tuple[bytes, int]:
    """At most `max_bytes` bytes of the regular file `path` from `offset`, and the file's size when it
    was opened. `FileNotFoundError`, `NotRegular`, `JobFileTimeout` or another `OSError` otherwise."""
    return _bounded(lambda: _read_at(path, offset, max_bytes), path, timeout_s)


def read_end(path: Path, max_bytes: int, *, timeout_s: float | None = None) -> bytes:
    """The last `max_bytes` bytes of the regular file `path` (fewer when it is shorter)."""
    return _bounded(lambda: _read_at(path, None, max_bytes), path, timeout_s)[0]


def read_all(path: Path, max_bytes: int, *, timeout_s: float | None = None) -> bytes:
    """The whole regular file `path`; `FileTooLarge` when it holds more than `max_bytes` bytes."""
    data, size = read_at(path, 0, max_bytes + 1, timeout_s=timeout_s)
    if len(data) > max_bytes or size > max_bytes:
        raise FileTooLarge(f"{path.name} is over {max_bytes} bytes", size)
    return data


def size_of(path: Path) -> int:
    """The size of the regular file `path` (`lstat`: a link or anything but a regular file is 0)."""
    try:
        st = path.lstat()
    except OSError:
        return 0
    return st.st_size if stat.S_ISREG(st.st_mode) else 0


class FileTooLarge(OSError):
    """The file holds more than the reader takes; `size` says how much."""

    def __init__(self, message: str, size: int) -> None:
        super().__init__(message)
        self.size = size


#: How large a small state file a job's folder holds (`request.json` with a plan, `exit.json`...) may be.
SMALL_FILE_BYTES = 16 * 1024 * 1024


def read_small_text(path: Path, max_bytes: int = SMALL_FILE_BYTES) -> str:
    """A small regular file's text (`read_all`, decoded as UTF-8 with replacement)."""
    return read_all(path, max_bytes).decode(errors="replace")


__all__ = ["POOL_SIZE", "SMALL_FILE_BYTES", "TIMEOUT_S", "FileTooLarge", "JobFileTimeout", "NotRegular",
           "read_all", "read_at", "read_end", "read_small_text", "size_of"]
