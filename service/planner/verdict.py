"""Whether a plan can be submitted as a job, as far as the spec and the plan alone tell: the part of a
submission's verdict that needs no server. The API's submission (`service.api.submission`) raises it
as a 422 with the same code, and `shardctl plan` offline reports it the same way.

- `does_not_fit`: no layout fits (the planner's reasons).
- `needs_runtime_support`: the job runs shardctl's built-in trainer (no `entrypoint`) and the plan
  needs what that trainer does not implement yet (offload, context parallelism, fp8). The planner
  puts every layout the trainer runs first, so this happens only when no such layout fits; the job
  would fail once launched. A user's own program (`entrypoint.command`) may implement them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from service.planner.result import Plan
from service.planner.runnable import runtime_gaps
from service.spec import TrainingSpec

DOES_NOT_FIT = "does_not_fit"
NEEDS_RUNTIME_SUPPORT = "needs_runtime_support"


@dataclass(frozen=True)
class Refusal:
    """Why a plan cannot become a job: a stable code, a message naming the fix, the spec fields at fault
    as (location, message) pairs, and details for a machine."""

    code: str
    message: str
    fields: tuple[tuple[str, str], ...] = ()
    details: dict[str, Any] = field(default_factory=dict)


def refusal(spec: TrainingSpec, result: Plan) -> Refusal | None:
    """The refusal of `result` (the plan of `spec`), or None when it can be submitted."""
    if not result.fits:
        return Refusal(DOES_NOT_FIT, "no layout fits: " + "; ".join(result.reasons),
                       details={"reasons": result.reasons, "min_gpus_to_fit": result.min_gpus_to_fit,
                                "closest": result.model_dump(mode="json")})
    gaps = runtime_gaps(result.layout, precision=spec.training.precision) if spec.entrypoint is None else []
    if not gaps:
        return None
    fix = ("set training.precision: bf16" if any(g.field == "precision" for g in gaps)
           else "ask for more GPUs (resources), so that a layout the trainer runs fits")
    message = (f"the layout that fits, {result.layout.short()}, needs what shardctl's built-in trainer does not"
               f" implement yet ({'; '.join(g.message for g in gaps)}); {fix}, or run your own program"
               " (entrypoint.command) that implements it")
    return Refusal(NEEDS_RUNTIME_SUPPORT, message, fields=tuple((g.loc, g.message) for g in gaps),
                   details={"layout": dataclasses.asdict(result.layout), "gaps": [g.field for g in gaps]})


__all__ = ["DOES_NOT_FIT", "NEEDS_RUNTIME_SUPPORT", "Refusal", "refusal"]
