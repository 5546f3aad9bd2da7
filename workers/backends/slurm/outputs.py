"""A Slurm attempt's logs and artifacts, read from its folder on the shared file system.

- Logs: submitit's per-node files `<slurm id>_<task>_log.{out,err}` (`logs.log_files`), stdout then
  stderr of each node in node order. torchrun tees every rank's lines there behind `[rank<r>]:`
  (`submission.build_submission`), so each line gets its global rank; submitit's, the launcher's and
  torchrun's own lines have none (rank None). Cursors are per-file byte offsets (`logfiles`).
  `finished` is never set here: knowing it would take an `sacct` per read, and the API already ends a
  live stream when the store says the attempt ended and a read finds nothing new.
- Artifacts: the files under the attempt's `out/` (the job's output folder, shared with the nodes).
"""

from __future__ import annotations

from pathlib import Path

from service.joblogs import ArtifactInfo, LogChunk
from workers.backends.logfiles import FileSource, list_folder, read_files, read_in_folder
from workers.backends.slurm.logs import log_files


def log_sources(folder: Path, slurm_id: str | None) -> list[FileSource]:
    files = sorted(log_files(folder, slurm_id), key=lambda p: (p.name.split("_")[1], p.suffix != ".out"))
    return [FileSource(key=p.name, path=p, stream="stdout" if p.suffix == ".out" else "stderr") for p in files]


def read_logs(folder: Path, slurm_id: str | None, *, rank: int | None, cursor: str | None, limit: int) -> LogChunk:
    return read_files(log_sources(folder, slurm_id), rank=rank, cursor=cursor, limit=limit, finished=False)


def list_artifacts(folder: Path) -> list[ArtifactInfo]:
    return list_folder(folder / "out")


def read_artifact(folder: Path, path: str, *, max_bytes: int) -> bytes:
    return read_in_folder(folder / "out", path, max_bytes=max_bytes)
