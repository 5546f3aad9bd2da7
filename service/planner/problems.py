"""A problem that keeps a layout from running, and the problems the parallel degrees have against the
model's dimensions: what both the layout's own checks (`layout.mesh_problems`) and the runtime's
(`runnable`) start from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from service.planner.models import ModelShape


@dataclass(frozen=True, slots=True)
class LayoutProblem:
    """One reason a layout cannot run: the layout field at fault and what to do instead."""

    field: str
    message: str
    gap: bool = False  # True: a runtime gap (implementable), False: structural

    @property
    def loc(self) -> str:
        """Where in the spec the fix goes: `training.precision` for the precision, else the layout field."""
        return "training.precision" if self.field == "precision" else f"layout.{self.field}"

    def __str__(self) -> str:
        return f"{self.loc}: {self.message}"


def dims_problems(shape: ModelShape, *, tp: int, pp: int, cp: int) -> list[LayoutProblem]:
    """Structural problems of the parallel degrees against the model's dimensions (the search's
    `layout.mesh_problems` and the runtime both use this)."""
    out: list[LayoutProblem] = []
    if shape.heads % tp or shape.kv_heads % tp:
        out.append(LayoutProblem("tp", f"tp={tp} must divide heads ({shape.heads}) and kv_heads ({shape.kv_heads})"))
    if shape.ffn_hidden % tp:
        out.append(LayoutProblem("tp", f"tp={tp} must divide ffn_hidden ({shape.ffn_hidden})"))
    if pp > shape.layers:
        out.append(LayoutProblem("pp", f"pp={pp} exceeds the model's {shape.layers} layers"))
    if cp > 1 and shape.seq_len % (2 * cp):
        out.append(LayoutProblem("cp", f"cp={cp} needs seq_len ({shape.seq_len}) divisible by 2*cp for load balance"))
    return out


__all__ = ["LayoutProblem", "dims_problems"]
