"""The API's `LogReader` (`service.api.logs_source`) over the configured backends: each attempt's logs
and artifacts read by its own backend (`base.LogReading`), with the backends' errors in the API's words.

A backend not configured on this server, or one that cannot read outputs, is `OutputsUnavailable`
(409 `not_available`); `BackendUnavailable` is `OutputsUnavailable(retry=True)` (503); any other `BackendError` is
`OutputsUnavailable` with the backend's reason.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

from service.joblogs import ArtifactInfo, AttemptRef, LogChunk, OutputsUnavailable
from workers.backends.base import Backend, BackendError, BackendUnavailable, Handle, LogReading

T = TypeVar("T")


class BackendOutputs:
    """Reads outputs through `backends`, keyed by backend kind (the dispatcher's mapping)."""

    def __init__(self, backends: Mapping[str, Backend]) -> None:
        self.backends = dict(backends)

    def _backend(self, ref: AttemptRef) -> LogReading:
        backend = self.backends.get(ref.backend)
        if backend is None:
            raise OutputsUnavailable(f"the {ref.backend} backend is not configured on this server"
                                     f" (configured: {sorted(self.backends)}), so it cannot read its outputs")
        if not isinstance(backend, LogReading):
            raise OutputsUnavailable(f"the {ref.backend} backend cannot read a job's logs or artifacts")
        return backend

    @staticmethod
    def _call(fn: Callable[[], T]) -> T:
        try:
            return fn()
        except BackendUnavailable as exc:
            raise OutputsUnavailable(str(exc), retry=True) from exc
        except BackendError as exc:
            raise OutputsUnavailable(str(exc)) from exc

    @staticmethod
    def _handle(ref: AttemptRef) -> Handle:
        return Handle(name=ref.name, backend_id=ref.backend_id)

    def read_logs(self, attempt: AttemptRef, *, rank: int | None, cursor: str | None, limit: int) -> LogChunk:
        backend = self._backend(attempt)
        return self._call(lambda: backend.read_logs(self._handle(attempt), rank=rank, cursor=cursor, limit=limit))

    def list_artifacts(self, attempt: AttemptRef) -> list[ArtifactInfo]:
        backend = self._backend(attempt)
        return self._call(lambda: backend.list_artifacts(self._handle(attempt)))

    def read_artifact(self, attempt: AttemptRef, path: str, *, max_bytes: int) -> bytes:
        backend = self._backend(attempt)
        return self._call(lambda: backend.read_artifact(self._handle(attempt), path, max_bytes=max_bytes))
