"""What one run needs, resolved from the plan (and the spec): model shape, layout, batch, steps.

The `Plan` JSON carries the layout, the memory and time predictions and the model's *name*, but
not the model's shape, the global batch's precision/optimizer settings or the step count in a
directly usable form. The runtime therefore accepts the spec too (`--spec`), and when none is
given it rebuilds the spec from the plan: the model preset named by `plan.model` (must be a
preset), `global_batch = dp * micro_batch * grad_accum_steps`, `precision = plan.precision.compute`,
`steps = round(plan.time.job_s / plan.time.step_s)`, optimizer AdamW. With a spec, the plan's
layout is re-estimated against it (`service.planner.estimate`) so the predictions the report
compares against always belong to the same spec and layout.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from service.planner import Layout, Plan, estimate
from service.planner.models import PRESETS, ModelShape, resolve_model
from service.spec import ModelSpec, Resources, TrainingConfig, TrainingSpec, load_spec


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


class RunConfig(BaseModel):
    """The resolved inputs of one run."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    spec: TrainingSpec
    plan: Plan
    shape: ModelShape
    options: RunOptions

    @property
    def layout(self) -> Layout:
        return self.plan.layout

    @property
    def steps(self) -> int:
        return self.options.steps if self.options.steps is not None else self.spec.training.steps


def spec_from_plan(plan: Plan) -> TrainingSpec:
    """Rebuild the spec a plan was made from, as far as the plan says (see the module docstring)."""
    if plan.model not in PRESETS:
        raise ValueError(f"plan.model is {plan.model!r}, not a preset: pass --spec with the model's shape")
    lay = plan.layout
    precision = plan.precision.compute
    steps = max(1, round(plan.time.job_s / plan.time.step_s)) if plan.time.step_s > 0 else 1
    return TrainingSpec(
        name=plan.name,
        model=ModelSpec(preset=plan.model),
        training=TrainingConfig(global_batch=lay.dp * lay.micro_batch * lay.grad_accum_steps,
                                precision=precision,
                                steps=steps),
        resources=Resources(gpu=plan.gpu, gpus_per_node=plan.gpus_per_node, gpus=plan.world_size),
    )


def load_plan(path: Path) -> Plan:
    return Plan.model_validate(json.loads(path.read_text(encoding="utf-8")))


def resolve_run(plan: Plan, spec: TrainingSpec | None, options: RunOptions) -> RunConfig:
    """Pair a plan with its spec; with a spec, re-estimate the plan's layout against it."""
    if spec is None:
        spec = spec_from_plan(plan)
    else:
        plan = estimate(spec, plan.layout)
    return RunConfig(spec=spec, plan=plan, shape=resolve_model(spec.model), options=options)


def load_run(plan_path: Path, spec_path: Path | None, options: RunOptions) -> RunConfig:
    return resolve_run(load_plan(plan_path), load_spec(spec_path) if spec_path else None, options)
