"""The planner: pure functions from a `TrainingSpec` to a `Plan` (no I/O, no torch)."""

from service.planner.errors import FieldProblem, InvalidSpec
from service.planner.layout import Layout
from service.planner.planning import estimate, plan
from service.planner.result import Plan

__all__ = ["FieldProblem", "InvalidSpec", "Layout", "Plan", "estimate", "plan"]
