"""The planner: pure functions from a `TrainingSpec` to a `Plan` (no I/O, no torch)."""

from service.planner.budget import Deadline, SearchBudgetExceeded
from service.planner.errors import FieldProblem, InvalidSpec
from service.planner.layout import Layout
from service.planner.planning import estimate, plan
from service.planner.result import Plan

__all__ = ["Deadline", "FieldProblem", "InvalidSpec", "Layout", "Plan", "SearchBudgetExceeded", "estimate", "plan"]
