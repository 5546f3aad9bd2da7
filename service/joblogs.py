"""What a job printed and wrote, as the backends read it and the API serves it: the data contract shared
by `workers.backends` (which read their own files and pod logs) and `service.api` (which never imports
them). Nothing here is stored: logs and artifacts stay where the job left them.

- `LogLine`/`LogChunk`: one page of a job attempt's output. `rank` is the global rank that printed the
  line (None for the launcher's own lines: torchrun's, submitit's); `stream` is `stdout`, `stderr`, or
  `output` where the backend keeps the two merged (a pod's log, a local node's log). Each line carries
  the cursor just after it, so reading resumes exactly there; `next_cursor` is the cursor after the
  whole chunk.
- Cursors are opaque strings (`encode_cursor`): base64url of a small JSON object, one entry per source
  (a file's byte offset, a pod log's last timestamp and how many lines carried it). A cursor from
  another attempt or a hand-made one is a `BadCursor`.
- `ArtifactInfo`: one file under the job's output folder (checkpoints, traces, the report).
- Errors: `OutputsUnavailable` (this backend cannot serve that, with the reason: a 409 `not_available` in the API),
  `ArtifactNotFound`, `ArtifactTooLarge`, `BadArtifactPath` (a path that leaves the output folder).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from datetime import datetime
from pathlib import PurePosixPath
from typing import Any, Literal

from pydantic import BaseModel, Field

LogStream = Literal["stdout", "stderr", "output"]
#: The prefix torchrun puts before each line of a rank when its output is teed to the launcher's console
#: (`--tee=3` and `TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE`, see `workers.backends.base.torchrun_command`).
RANK_PREFIX_TEMPLATE = "[rank${rank}]:"
RANK_PREFIX = re.compile(r"^\[rank(\d{1,7})\]:")
#: A cursor longer than this is refused (a real one has one short entry per source).
MAX_CURSOR_CHARS = 16_384


class LogLine(BaseModel):
    rank: int | None = Field(description="The global rank that printed it; None for the launcher's own lines.")
    stream: LogStream
    line: str = Field(description="The line without its end of line (and without torchrun's rank prefix).")
    cursor: str = Field(description="Resume here to read what follows this line.")


class LogChunk(BaseModel):
    lines: list[LogLine] = Field(default_factory=list)
    next_cursor: str = Field(description="Resume here to read what follows this chunk.")
    finished: bool = Field(False, description="The backend knows the attempt has ended and nothing follows.")


class ArtifactInfo(BaseModel):
    path: str = Field(description="Relative to the job's output folder, '/'-separated.")
    size: int = Field(description="Bytes.")
    modified: datetime


class AttemptRef(BaseModel):
    """Which attempt's outputs: what the store knows of it (the backend names the rest)."""

    backend: str
    name: str = Field(description="The attempt's backend name, shardctl-<job id>-<n>.")
    backend_id: str | None = None
    job_id: int
    attempt: int


class OutputsError(Exception):
    """Base of the errors reading a job's outputs raises."""


class OutputsUnavailable(OutputsError):
    """This backend cannot serve that (not configured, no readable folder, not answering)."""

    def __init__(self, message: str, *, retry: bool = False) -> None:
        super().__init__(message)
        self.retry = retry  # the backend did not answer: try later (503), rather than never (409)


class BadCursor(OutputsError, ValueError):
    """A cursor this reader did not make."""


class ArtifactNotFound(OutputsError):
    pass


class ArtifactTooLarge(OutputsError):
    pass


class BadArtifactPath(OutputsError, ValueError):
    pass


def encode_cursor(state: dict[str, Any]) -> str:
    """An opaque, URL-safe cursor for `state` (compact JSON, base64url without padding)."""
    raw = json.dumps(state, separators=(",", ":"), sort_keys=True).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str | None) -> dict[str, Any]:
    """The state `encode_cursor` made; {} for None or "" (the beginning). `BadCursor` otherwise."""
    if not cursor:
        return {}
    if len(cursor) > MAX_CURSOR_CHARS:
        raise BadCursor(f"cursor longer than {MAX_CURSOR_CHARS} characters")
    try:
        state = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (binascii.Error, ValueError, RecursionError) as exc:  # RecursionError: JSON nested thousands deep
        raise BadCursor("not a cursor this server made: pass back a `cursor` or `next_cursor` as sent") from exc
    if not isinstance(state, dict):
        raise BadCursor("not a cursor this server made: pass back a `cursor` or `next_cursor` as sent")
    return state


def split_rank(text: str) -> tuple[int | None, str]:
    """(rank, text) of a launcher console line: the rank torchrun's prefix names, else None."""
    match = RANK_PREFIX.match(text)
    if match is None:
        return None, text
    return int(match.group(1)), text[match.end():]


def safe_relative(path: str) -> PurePosixPath:
    """`path` as a relative path that stays inside its folder; `BadArtifactPath` otherwise."""
    if not path or "\x00" in path or "\\" in path:
        raise BadArtifactPath(f"{path!r} is not a path inside the job's output folder")
    rel = PurePosixPath(path)
    if rel.is_absolute() or any(part in ("..", "") for part in rel.parts) or str(rel) == ".":
        raise BadArtifactPath(f"{path!r} is not a path inside the job's output folder (no '..', not absolute)")
    return rel
