"""What shardctl's runtime can run: the one place that decides, for the search and for the runtime.

Pure (no torch): the planner's search filters with these functions while it enumerates, and the
runtime (`workers.runtime.parallelize.check_supported`) refuses a plan with the same functions
before it builds anything, so a layout the search can return is a layout the runtime accepts.

Two kinds of problem:

- **structural** (`layout_problems`): combinations no build of the runtime applies (DDP or ZeRO-1
  with tensor parallelism: DDP does not take DTensor parameters; ZeRO-1 under a pipeline; fp16 loss
  scaling under a pipeline; sequence parallelism without tp; offload of parameters without full
  sharding...). The search never builds them and a pin asking for one is refused with the fix.
- **runtime gaps** (`runtime_gaps`): layouts the planner models and costs, but this runtime does not
  implement yet (context parallelism, CPU offload, fp8: the planner models per-tensor scaled fp8
  matmuls, the runtime has no float8 linear layers). The search ranks every layout without a gap
  above every layout with one, so a gap is chosen only when nothing the runtime runs fits; the plan
  then says so in a warning, and the runtime refuses it naming the field.

`is_runnable(layout, precision=...)` is the question "would the runtime accept this layout?".
Each problem names the layout field and the fix.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from service.planner.problems import LayoutProblem, dims_problems

if TYPE_CHECKING:
    from service.planner.layout import Layout
    from service.planner.models import ModelShape

FULLY_SHARDED = frozenset({"zero3", "fsdp", "hsdp"})

PIPELINE_SCHEDULES = ("gpipe", "1f1b", "interleaved")


def sharding_problems(*, tp: int, pp: int, sharding: str, dp: int, dp_shard: int, sequence_parallel: bool,
                      precision: str, cp: int = 1, attention: str = "flash") -> list[LayoutProblem]:
    """Structural problems of the fields the search fixes first: the mesh, the sharding, SP."""
    out: list[LayoutProblem] = []
    if tp > 1 and sharding in ("ddp", "zero1"):
        out.append(LayoutProblem("sharding", f"sharding={sharding} with tp={tp}: DDP does not take DTensor"
                                 " parameters; use sharding fsdp (or zero2) with tensor parallelism"))
    if sharding == "zero1" and pp > 1:
        out.append(LayoutProblem("sharding", "zero1 with pp > 1 is not implemented; use ddp or fsdp with pipelines"))
    if precision == "fp16" and pp > 1:
        out.append(LayoutProblem("pp", "fp16 loss scaling with pipeline parallelism is not implemented; use bf16"))
    if sequence_parallel and tp == 1:
        out.append(LayoutProblem("sequence_parallel", "sequence parallelism needs tp > 1"))
    if sharding == "hsdp" and (dp_shard < 1 or dp % dp_shard):
        out.append(LayoutProblem("dp_shard", f"dp_shard={dp_shard} must divide dp={dp}"))
    if cp > 1 and attention == "eager":
        out.append(LayoutProblem("cp", "context parallelism needs flash attention (training.attention: flash)"))
    return out


def offload_problems(*, sharding: str, offload: str) -> list[LayoutProblem]:
    """Structural: offloading parameters needs them fully sharded (FSDP2's `CPUOffloadPolicy`)."""
    if offload == "params" and sharding not in FULLY_SHARDED:
        return [LayoutProblem("offload", f"offload=params needs sharding zero3, fsdp or hsdp (FSDP2's"
                              f" CPUOffloadPolicy), not {sharding}; use offload=optimizer with {sharding}")]
    return []


def schedule_problems(*, pp: int, pipeline_schedule: str | None, virtual_stages: int, grad_accum_steps: int,
                      layers: int | None = None) -> list[LayoutProblem]:
    """Structural problems of the pipeline fields."""
    if pp == 1:
        if virtual_stages > 1:
            return [LayoutProblem("virtual_stages", "virtual_stages > 1 needs pp > 1")]
        return []
    out: list[LayoutProblem] = []
    if pipeline_schedule not in PIPELINE_SCHEDULES:
        out.append(LayoutProblem("pipeline_schedule", f"unknown schedule {pipeline_schedule!r}; use one of"
                                 f" {', '.join(PIPELINE_SCHEDULES)}"))
    if grad_accum_steps < pp:
        out.append(LayoutProblem("micro_batch", f"pp={pp} needs at least pp micro-batches per step"
                                 f" (grad_accum_steps={grad_accum_steps}); use a smaller micro_batch"))
    if pipeline_schedule == "interleaved":
        if virtual_stages < 2:
            out.append(LayoutProblem("virtual_stages", "an interleaved schedule needs virtual_stages >= 2"))
        if grad_accum_steps % pp:
            out.append(LayoutProblem("micro_batch", f"the interleaved schedule needs grad_accum_steps"
                                     f" ({grad_accum_steps}) to be a multiple of pp ({pp})"))
        if layers is not None and pp * virtual_stages > layers:
            out.append(LayoutProblem("virtual_stages", f"pp*virtual_stages ({pp}*{virtual_stages}) exceeds the"
                                     f" model's {layers} layers"))
    elif virtual_stages > 1:
        out.append(LayoutProblem("virtual_stages", f"virtual_stages > 1 needs pipeline_schedule: interleaved,"
                                 f" not {pipeline_schedule}"))
    return out


def shape_problems(layout: Layout, shape: ModelShape) -> list[LayoutProblem]:
    """Structural problems of the layout against the model's dimensions."""
    return dims_problems(shape, tp=layout.tp, pp=layout.pp, cp=layout.cp)


def layout_problems(layout: Layout, *, precision: str, attention: str = "flash",
                    shape: ModelShape | None = None) -> list[LayoutProblem]:
    """Every structural problem of `layout` (empty when no build of the runtime refuses it for its shape)."""
    out = sharding_problems(tp=layout.tp, pp=layout.pp, sharding=layout.sharding, dp=layout.dp,
                            dp_shard=layout.dp_shard, sequence_parallel=layout.sequence_parallel,
                            precision=precision, cp=layout.cp, attention=attention)
    out += offload_problems(sharding=layout.sharding, offload=layout.offload)
    out += schedule_problems(pp=layout.pp, pipeline_schedule=layout.pipeline_schedule,
                             virtual_stages=layout.virtual_stages, grad_accum_steps=layout.grad_accum_steps,
                             layers=shape.layers if shape is not None else None)
    if shape is not None:
        out += shape_problems(layout, shape)
    return out


def runtime_gaps(layout: Layout, *, precision: str) -> list[LayoutProblem]:
    """What the planner models but this runtime does not implement yet (each `gap=True`)."""
    out: list[LayoutProblem] = []
    if layout.cp > 1:
        out.append(LayoutProblem("cp", "context parallelism is not implemented by the runtime yet", gap=True))
    if layout.offload != "none":
        out.append(LayoutProblem("offload", f"offload={layout.offload} is not implemented by the runtime yet",
                                 gap=True))
    if precision == "fp8":
        out.append(LayoutProblem("precision", "training.precision fp8 is planner-only: the runtime has no float8"
                                 " linear layers (torchao.float8 is not part of it), so the plan's fp8 step time"
                                 " is an estimate nobody can run here; use training.precision: bf16 to run the job",
                                 gap=True))
    return out


def has_gap(layout: Layout, precision: str) -> bool:
    """`runtime_gaps(...)` is not empty; the search's hot path."""
    return layout.cp > 1 or layout.offload != "none" or precision == "fp8"


def runtime_problems(layout: Layout, *, precision: str, attention: str = "flash",
                     shape: ModelShape | None = None) -> list[LayoutProblem]:
    """Everything the runtime refuses: structural problems first, then gaps."""
    return layout_problems(layout, precision=precision, attention=attention, shape=shape) + runtime_gaps(
        layout, precision=precision)


def is_runnable(layout: Layout, *, precision: str, attention: str = "flash", shape: ModelShape | None = None) -> bool:
    """Would shardctl's runtime accept this layout (no structural problem and no gap)?"""
    return not runtime_problems(layout, precision=precision, attention=attention, shape=shape)


__all__ = ["FULLY_SHARDED", "LayoutProblem", "dims_problems", "has_gap", "is_runnable", "layout_problems",
           "offload_problems", "runtime_gaps", "runtime_problems", "schedule_problems", "shape_problems",
           "sharding_problems"]
