"""A local attempt's logs and artifacts, read from its run folder (`<folder>/<name>/`, see `local`).

- Logs: each simulated node's `node<n>.log`, where the supervisor sends its torchrun agent's stdout and
  stderr together (stream `output`). torchrun tees every rank's lines there behind `[rank<r>]:`
  (`local_supervisor.node_commands`), so each line is given its global rank; lines without a prefix
  are torchrun's own (rank None). A single-process job runs without torchrun: its one log is rank 0.
  Cursors are per-node byte offsets (`logfiles`).
- Artifacts: the files under the attempt's `out/` (the job's working and output folder).
"""

from __future__ import annotations

import re
from pathlib import Path

from service.joblogs import ArtifactInfo, LogChunk
from workers.backends import jobfiles
from workers.backends.base import LaunchRequest
from workers.backends.logfiles import FileSource, list_folder, read_files, read_in_folder

_NODE_LOG = re.compile(r"^node(\d+)\.log$")


def read_request(folder: Path) -> LaunchRequest | None:
    """The attempt's `request.json` (read as a file the job can write: `jobfiles`), or None when it
    cannot be read or is not a request."""
    try:
        return LaunchRequest.model_validate_json(jobfiles.read_small_text(folder / "request.json"))
    except (OSError, ValueError):
        return None


def log_sources(folder: Path) -> list[FileSource]:
    """One source per simulated node, in node order."""
    req = read_request(folder)
    if req is not None:
        nodes = range(req.nodes)
    else:  # an unreadable request: the node logs that are there
        found = (_NODE_LOG.match(p.name) for p in folder.glob("node*.log")) if folder.is_dir() else iter(())
        nodes = range(1 + max((int(m.group(1)) for m in found if m), default=0))
    single = req is not None and req.world_size == 1
    return [FileSource(key=f"node{n}", path=folder / f"node{n}.log", stream="output",
                       default_rank=0 if single else None) for n in nodes]


def read_logs(folder: Path, *, rank: int | None, cursor: str | None, limit: int, finished: bool) -> LogChunk:
    """See `logfiles.read_files`; `finished`: the attempt had ended before this call."""
    return read_files(log_sources(folder), rank=rank, cursor=cursor, limit=limit, finished=finished)


def out_dir(folder: Path) -> Path:
    return folder / "out"


def list_artifacts(folder: Path) -> list[ArtifactInfo]:
    return list_folder(out_dir(folder))


def read_artifact(folder: Path, path: str, *, max_bytes: int) -> bytes:
    return read_in_folder(out_dir(folder), path, max_bytes=max_bytes)
