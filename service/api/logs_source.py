"""How the API reads a job's logs and artifacts without importing a backend: `create_app(log_reader=...)`
is given something that answers this protocol (the composition module, `service.cli.wiring`, passes
`workers.backends.outputs.BackendOutputs` over the configured backends). Without one, the logs and
artifacts routes answer 409 `not_available`.

Each method reads the backend's own files or API on demand (nothing is copied into the database) and
raises `service.joblogs`'s errors: `OutputsUnavailable` (this backend or server cannot; `retry` when it
did not answer), `BadCursor`, `ArtifactNotFound`, `ArtifactTooLarge`, `BadArtifactPath`. Methods block:
the routes call them on worker threads.
"""

from __future__ import annotations

from typing import Protocol

from service.joblogs import ArtifactInfo, AttemptRef, LogChunk


class LogReader(Protocol):
    def read_logs(self, attempt: AttemptRef, *, rank: int | None, cursor: str | None, limit: int) -> LogChunk:
        """At most `limit` lines after `cursor` (None: from the start), only `rank`'s when given."""
        ...

    def list_artifacts(self, attempt: AttemptRef) -> list[ArtifactInfo]:
        """The files under the attempt's output folder."""
        ...

    def read_artifact(self, attempt: AttemptRef, path: str, *, max_bytes: int) -> bytes:
        """One file under the attempt's output folder, at most `max_bytes` long."""
        ...
