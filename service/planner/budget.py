"""A time budget for the layout search: a deadline the search checks as it goes.

The search is pure Python and a thread running it cannot be stopped from outside, so the search
stops itself: `search` and `smallest_fitting_world` check the deadline once per mesh and once per
micro-batch (at most a few dozen layouts apart) and raise `SearchBudgetExceeded` once it has passed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Deadline:
    """`budget_s` seconds after the moment `after` was called (on the monotonic clock)."""

    budget_s: float
    at: float

    @classmethod
    def after(cls, budget_s: float) -> Deadline:
        return cls(budget_s=budget_s, at=time.monotonic() + budget_s)

    def check(self, evaluated: int = 0) -> None:
        """Raise `SearchBudgetExceeded` when the deadline has passed."""
        if time.monotonic() >= self.at:
            raise SearchBudgetExceeded(self.budget_s, evaluated)


class SearchBudgetExceeded(Exception):
    """The search ran out of its time budget before it finished (the spec itself may be valid)."""

    def __init__(self, budget_s: float, evaluated: int) -> None:
        self.budget_s, self.evaluated = budget_s, evaluated
        super().__init__(f"the layout search stopped at its {budget_s:g} s budget after evaluating"
                         f" {evaluated} layouts")


__all__ = ["Deadline", "SearchBudgetExceeded"]
