"""Errors the planner reports about a spec, in the same shape as pydantic's: a field path and a message."""

from __future__ import annotations

from pydantic import BaseModel


class FieldProblem(BaseModel):
    """One thing wrong with a spec: where (`loc`, e.g. ("layout", "tp")) and what is allowed."""

    loc: tuple[str, ...]
    message: str

    @property
    def path(self) -> str:
        return ".".join(self.loc)


class InvalidSpec(ValueError):
    """A spec that passed its own validation but cannot be planned (unknown GPU, tp not dividing heads...)."""

    def __init__(self, problems: list[FieldProblem]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{p.path}: {p.message}" for p in problems))
