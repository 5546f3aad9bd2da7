"""Reading a job's output from files the backend keeps (the local run folder, Slurm's shared folder):
log files by byte offset, and the output folder's files as artifacts. Used by `local_logs` and
`slurm.logs`; the contract of the models and cursors is `service.joblogs`.

Cursor state: `{source key: byte offset}`. Only whole lines are returned (a line still being written
waits for its end of line) until the attempt has ended; a line longer than `MAX_READ` is cut there.
Lines of several sources are not interleaved by time (no source records it): each read takes what is
new in each source in turn, so each source's lines stay in order and the merge is fair across reads.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from service.joblogs import (
    ArtifactInfo,
    ArtifactNotFound,
    ArtifactTooLarge,
    BadArtifactPath,
    BadCursor,
    LogChunk,
    LogLine,
    LogStream,
    decode_cursor,
    encode_cursor,
    safe_relative,
    split_rank,
)
from workers.backends import jobfiles

#: Bytes read from one source in one call (a longer line is cut into pieces of this size).
MAX_READ = 256 * 1024
#: Files an artifact listing shows at most (the first ones, by path).
MAX_ARTIFACTS = 10_000


@dataclass(frozen=True)
class FileSource:
    """One log file: its cursor key, path, stream, and the rank of its lines that name none."""

    key: str
    path: Path
    stream: LogStream
    default_rank: int | None = None


#: No log file is this large; a bigger offset is a forged cursor (seek would fail with EINVAL or overflow).
MAX_OFFSET = 1 << 48


def offsets_of(cursor: str | None) -> dict[str, int]:
    state = decode_cursor(cursor)
    if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_OFFSET for v in state.values()):
        raise BadCursor("not a cursor of this job's log files: pass back a `cursor` or `next_cursor` as sent")
    return dict(state)


def _read(path: Path, offset: int) -> tuple[bytes, bool, int]:
    """Up to MAX_READ bytes from `offset`, whether that reached the end of the file, and its size. A
    file that cannot be read (absent, not a regular file, too slow: `jobfiles`) reads as empty."""
    try:
        data, size = jobfiles.read_at(path, offset, MAX_READ + 1)
    except OSError:
        return b"", True, 0
    return data[:MAX_READ], len(data) <= MAX_READ, size


def read_files(sources: Sequence[FileSource], *, rank: int | None, cursor: str | None, limit: int,
               finished: bool) -> LogChunk:
    """At most `limit` lines after `cursor` from `sources` (those of `rank` only, when given).
    `finished`: the attempt had ended before this call (checked first, so nothing written later is
    missed); then a last line without an end of line is returned too, and the chunk is `finished`
    once every source is read to its end."""
    offsets = offsets_of(cursor)
    lines: list[LogLine] = []
    drained = True
    for src in sources:
        if len(lines) >= limit:
            drained = False
            break
        pos = offsets.get(src.key, 0)
        data, at_end, size = _read(src.path, pos)
        end = data.rfind(b"\n") + 1
        if not at_end and end == 0:
            end = len(data)  # one line longer than MAX_READ: cut it
        elif at_end and finished:
            end = len(data)
        for raw in data[:end].splitlines(keepends=True):
            pos += len(raw)
            offsets[src.key] = pos
            text = raw.rstrip(b"\r\n").decode(errors="replace")
            line_rank, text = split_rank(text)
            if line_rank is None:
                line_rank = src.default_rank
            if rank is not None and line_rank != rank:
                continue
            lines.append(LogLine(rank=line_rank, stream=src.stream, line=text, cursor=encode_cursor(offsets)))
            if len(lines) >= limit:
                break
        if pos < size:
            drained = False
    return LogChunk(lines=lines, next_cursor=encode_cursor(offsets), finished=finished and drained)


# -- artifacts -------------------------------------------------------------------------------------

def _walk(root: Path) -> Iterable[Path]:
    for folder, dirs, files in os.walk(root, followlinks=False):
        dirs.sort()
        for name in sorted(files):
            yield Path(folder) / name


def list_folder(root: Path) -> list[ArtifactInfo]:
    """The regular files under `root` (symbolic links and what they point to left out), by path; at
    most MAX_ARTIFACTS. An absent folder lists nothing."""
    out: list[ArtifactInfo] = []
    if not root.is_dir():
        return out
    for path in _walk(root):
        try:
            st = path.lstat()
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode):  # links, FIFOs, sockets and devices are no artifacts
            continue
        out.append(ArtifactInfo(path=path.relative_to(root).as_posix(), size=st.st_size,
                                modified=datetime.fromtimestamp(st.st_mtime, UTC)))
        if len(out) >= MAX_ARTIFACTS:
            break
    return out


def read_in_folder(root: Path, path: str, *, max_bytes: int) -> bytes:
    """The bytes of the regular file `path` under `root`. `BadArtifactPath` for a path that leaves
    `root` (`..`, absolute, through a symbolic link), `ArtifactNotFound`, `ArtifactTooLarge` over
    `max_bytes`."""
    rel = safe_relative(path)
    base = root.resolve()
    target = (root / rel).resolve()
    if not target.is_relative_to(base):
        raise BadArtifactPath(f"{path!r} leads outside the job's output folder")
    try:
        return jobfiles.read_all(target, max_bytes)
    except jobfiles.FileTooLarge as exc:
        raise ArtifactTooLarge(f"{path!r} is {exc.size} bytes, over the download limit of {max_bytes} bytes"
                               " (SHARDCTL_MAX_ARTIFACT_BYTES); copy it from the job's folder") from None
    except OSError:
        raise ArtifactNotFound(f"no file {path!r} in the job's output folder") from None
