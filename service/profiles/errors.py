"""Errors raised for input that cannot be analysed."""

from __future__ import annotations

from pathlib import Path


class TraceError(ValueError):
    """A trace file that cannot be read or analysed.

    ``str(err)`` names the file and the problem, e.g.
    ``rank0.json.gz: truncated gzip stream (the file ends before the compressed data does)``.
    """

    def __init__(self, path: Path | str, problem: str) -> None:
        self.path = Path(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")
