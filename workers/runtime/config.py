"""What one run needs, all of it from the plan: model shape, layout, batch, optimizer, steps.

A plan carries the resolved model shape and the training settings it was made for, so a job runs
the plan exactly as the API stored and showed it; nothing is re-planned here, and the report's
"predicted" figures are the stored plan's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from service.planner import Layout, Plan
from service.planner.models import ModelShape
from service.spec import TrainingConfig


class PlanNotRunnable(ValueError):
    """The plan cannot be run: unreadable, or made before plans carried the model shape."""


class RunOptions(BaseModel):
    """Knobs of the runtime itself (not of the plan)."""

    model_config = ConfigDict(extra="forbid")

    seed: int = 1234
    lr: float = 1e-3
    steps: int | None = None
    timeout_s: float = 300.0
    checkpoint_every: int = 0
    stop_after: int | None = None
    heartbeat_every: int = 10
    profile: bool = True
    profile_wait: int = 1
    profile_warmup: int = 1
    profile_active: int = 2
    track_memory: bool = True
    fail_rank: int | None = None
    fail_step: int | None = None
    device: Literal["auto", "cpu", "cuda"] = "auto"
    #: per-process memory budget in bytes (`workers.runtime.memory_budget`); None: the device's own memory
    memory_budget: int | None = None


class RunConfig(BaseModel):
    """The resolved inputs of one run."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    plan: Plan
    shape: ModelShape
    training: TrainingConfig
    options: RunOptions

    @property
    def layout(self) -> Layout:
        return self.plan.layout

    @property
    def steps(self) -> int:
        return self.options.steps if self.options.steps is not None else self.training.steps


def resolve_run(plan: Plan, options: RunOptions) -> RunConfig:
    """The run of `plan` as stored; `PlanNotRunnable` when it lacks the model shape or training."""
    if plan.shape is None or plan.training is None:
        raise PlanNotRunnable(f"plan {plan.name!r} carries no model shape: it was made by an older shardctl;"
                              " plan the spec again (`shardctl plan SPEC --json`) and run that plan")
    return RunConfig(plan=plan, shape=plan.shape, training=plan.training, options=options)


def load_plan(path: Path) -> Plan:
    try:
        return Plan.model_validate_json(path.read_bytes())
    except ValidationError as exc:
        raise PlanNotRunnable(f"{path} is not a plan as `shardctl plan --json` prints it: {exc}") from exc
