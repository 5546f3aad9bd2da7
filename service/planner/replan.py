"""Out-of-memory re-planning: the next layout after an attempt ran out of memory. Pure (no I/O, no store).

`next_plan(spec, failed, failure, measured)` climbs a ladder that keeps the global batch, one rung at a
time, and returns the first plan that the memory model, capped at what the failed attempt measured,
says fits:

1. `micro_batch`: a smaller micro-batch, more gradient accumulation;
2. `activation_checkpointing`: recompute activations (and the micro-batch again);
3. `sharding`: shard the model states further (ZeRO/FSDP);
4. `model_parallel`: tensor, pipeline or context parallelism (a new mesh);
5. `offload`: optimizer state or parameters to host memory (not after `oom_host`: host memory ran out).

A job on shardctl's built-in trainer (no `entrypoint`) never gets a layout that trainer does not
implement yet (offload, context parallelism: `runnable.runtime_gaps`); such a rung is passed over.

Rung k frees the layout fields of rungs 1..k and pins every other field to the failed layout's value,
then calls the planner's public `plan` on the spec with those pins; fields the user pinned stay pinned
(a rung that needs one of them finds nothing new and the ladder goes on). The planner itself chooses
within a rung (the fastest layout that fits), so the result is deterministic: the same inputs give
the same plan (unless the ladder's searches pass `LADDER_BUDGET_S`, below).

**The cap** (`memory_cap`). Bytes are tensor bytes per rank, the part the runtime can measure: the
plan's `memory.total` less its runtime overhead and allocator margin (`predicted_allocated`), as the
run report compares it. With P the failed plan's prediction, M the peak the rank measured (held bytes
plus the allocation that failed) and L the limit it ran into (device memory or the runtime's budget):

- the model under-predicted by s = max(1, M / P);
- the next attempt must hold less than L (M when the limit is unknown) in real bytes, so its
  prediction must stay under `cap = min(L, M) / s`; with s > 1 this is the failed prediction scaled
  by measured/predicted, and it is never more than P, so the next layout always predicts less;
- without a measurement (a process killed by the OOM killer, Slurm's OUT_OF_MEMORY) the cap is P.

All the rungs' searches share `LADDER_BUDGET_S` (10 s: the dispatcher re-plans inside the transaction
that closes the attempt, which must stay well inside SQLite's 30 s busy timeout and hold PostgreSQL's
row lock briefly); a rung whose search runs past it is skipped, as a rung without an answer. The
planner is given the cap as the spec's GPU memory (`resources.gpu.memory_gib`, its documented input:
cap x (1 + the failed plan's allocator margin) + its runtime overhead, never more than the device, less a
millionth so that the failed layout itself is out), and
the plan it returns must predict strictly less than the cap; after `oom_host` it must also offload no
more host memory per node than the failed plan. The plan's `memory.gpu_memory` is then that cap, and
its warnings say why.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, ValidationError

from service.failures import FailureClass, MeasuredOom
from service.planner import Deadline, InvalidSpec, Layout, Plan, SearchBudgetExceeded
from service.planner import plan as make_plan
from service.planner.hardware import GIB, resolve_cluster
from service.planner.runnable import runtime_gaps
from service.spec import GpuOverride, LayoutPins, TrainingSpec

Rung = Literal["micro_batch", "activation_checkpointing", "sharding", "model_parallel", "offload"]
RUNGS: tuple[Rung, ...] = ("micro_batch", "activation_checkpointing", "sharding", "model_parallel", "offload")
#: the layout fields each rung frees (cumulatively: rung k frees those of rungs 1..k)
FREED: dict[Rung, tuple[str, ...]] = {
    "micro_batch": ("micro_batch",),
    "activation_checkpointing": ("activation_checkpointing",),
    "sharding": ("sharding", "dp_shard"),
    "model_parallel": ("dp", "tp", "pp", "cp", "sequence_parallel", "pipeline_schedule", "virtual_stages"),
    "offload": ("offload",),
}
#: the most one rung's search may take; a rung past it is skipped (it runs inside the dispatcher's transaction)
LADDER_BUDGET_S = 10.0
_PIN_FIELDS = ("dp", "tp", "pp", "cp", "sharding", "dp_shard", "sequence_parallel", "micro_batch",
               "activation_checkpointing", "pipeline_schedule", "virtual_stages", "offload")


class MemoryCap(BaseModel):
    """What the next plan must stay under, and where that figure comes from (bytes per rank)."""

    predicted_bytes: int = Field(description="The failed plan's predicted tensor bytes (`predicted_allocated`).")
    measured_bytes: int | None = Field(None, description="The peak the rank measured when it ran out.")
    limit_bytes: int | None = Field(None, description="What the rank could hold (device memory or budget).")
    scale: float = Field(description="measured / predicted when the model under-predicted, else 1.")
    cap_bytes: int = Field(description="The next plan's predicted tensor bytes must be less than this.")


class Replan(BaseModel):
    """The next attempt's plan, the rung that gave it and the cap it was chosen under."""

    plan: Plan
    rung: Rung
    cap: MemoryCap
    tried: list[str] = Field(default_factory=list, description="Rungs below it and why each gave nothing.")


class NoReplan(BaseModel):
    """No rung gave a plan under the cap: why, rung by rung."""

    cap: MemoryCap
    tried: list[str]

    @property
    def reason(self) -> str:
        return (f"no layout keeps the global batch and predicts less than {_mib(self.cap.cap_bytes)} per rank: "
                + "; ".join(self.tried))


def predicted_allocated(plan: Plan) -> int:
    """The plan's predicted tensor bytes per rank: `memory.total` less runtime overhead and allocator margin
    (what `torch.cuda.max_memory_allocated`, or the runtime's CPU budget, measures)."""
    m = plan.memory
    return m.total - m.runtime_overhead - m.allocator_margin


def memory_cap(failed: Plan, measured: MeasuredOom | None) -> MemoryCap:
    """The cap the next plan's prediction must stay under (see the module's docstring)."""
    predicted = max(1, predicted_allocated(failed))
    if measured is None or measured.peak_bytes <= 0:
        return MemoryCap(predicted_bytes=predicted, scale=1.0, cap_bytes=predicted)
    peak = measured.peak_bytes
    scale = max(1.0, peak / predicted)
    real = min(peak, measured.limit_bytes) if measured.limit_bytes else peak
    return MemoryCap(predicted_bytes=predicted, measured_bytes=peak, limit_bytes=measured.limit_bytes,
                     scale=scale, cap_bytes=max(1, min(predicted, int(real / scale))))


def rung_pins(spec: TrainingSpec, failed: Layout, rung: Rung) -> LayoutPins:
    """The pins of `rung`: the failed layout's values for every field the rungs up to it do not free, the
    user's own pins for those they do."""
    freed = {f for r in RUNGS[: RUNGS.index(rung) + 1] for f in FREED[r]}
    values: dict[str, object] = {}
    for name in _PIN_FIELDS:
        values[name] = getattr(spec.layout, name) if name in freed else getattr(failed, name)
    if values["sharding"] != "hsdp" and "dp_shard" not in freed:
        values["dp_shard"] = None
    if values["tp"] == 1 and not values["sequence_parallel"]:
        values["sequence_parallel"] = None
    if values["pp"] == 1 and "pp" not in freed:
        values["pipeline_schedule"] = values["virtual_stages"] = None
    return LayoutPins.model_validate(values)


def _capped_spec(spec: TrainingSpec, failed: Plan, cap: MemoryCap) -> TrainingSpec:
    """The spec with the rank's memory capped: `resources.gpu.memory_gib` such that the planner's check
    (`memory.total <= gpu_memory`) keeps tensors at about `cap` (the failed plan's margin and overhead)."""
    mem = failed.memory
    margin = mem.allocator_margin / max(1, predicted_allocated(failed))
    per_rank = min(mem.gpu_memory, int(cap.cap_bytes * (1 + margin)) + mem.runtime_overhead)
    per_rank -= max(1, per_rank // 1_000_000)  # strictly under the cap, whatever the rounding of the margin
    cluster = resolve_cluster(spec.resources)
    per_node_share = cluster.gpu.memory_gib * GIB / max(1, cluster.memory_bytes_per_gpu)
    memory_gib = per_rank * per_node_share / GIB
    gpu = spec.resources.gpu
    override = (GpuOverride(name=gpu, memory_gib=memory_gib) if isinstance(gpu, str)
                else gpu.model_copy(update={"memory_gib": memory_gib}))
    return spec.model_copy(update={"resources": spec.resources.model_copy(update={"gpu": override})})


def next_plan(spec: TrainingSpec, failed: Plan, failure: FailureClass,
              measured: MeasuredOom | None = None) -> Replan | NoReplan:
    """The plan of the attempt after `failed` ran out of memory (`failure`: oom_gpu or oom_host), or why
    there is none. Pure and deterministic."""
    cap = memory_cap(failed, measured)
    capped = _capped_spec(spec, failed, cap)
    host_before = failed.memory.cpu_memory or 0
    tried: list[str] = []
    deadline = Deadline.after(LADDER_BUDGET_S)  # one budget for the whole ladder
    for rung in RUNGS:
        if rung == "offload" and failure == FailureClass.OOM_HOST:
            tried.append("offload: not after running out of host memory")
            continue
        try:
            pins = rung_pins(spec, failed.layout, rung)
            candidate = make_plan(capped.model_copy(update={"layout": pins}), deadline=deadline)
        except ValidationError as exc:  # the failed layout's values and the user's pins disagree
            tried.append(f"{rung}: " + "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors()))
            continue
        except (InvalidSpec, SearchBudgetExceeded) as exc:
            tried.append(f"{rung}: {exc}")
            continue
        lay = candidate.layout
        if not candidate.fits:
            tried.append(f"{rung}: nothing fits ({'; '.join(candidate.reasons) or 'no reason given'})")
        elif spec.entrypoint is None and (gaps := runtime_gaps(lay, precision=spec.training.precision)):
            tried.append(f"{rung}: {lay.short()} needs what the built-in trainer does not implement yet"
                         f" ({'; '.join(g.message for g in gaps)})")
        elif predicted_allocated(candidate) >= cap.cap_bytes:
            tried.append(f"{rung}: {lay.short()} predicts {_mib(predicted_allocated(candidate))}")
        elif failure == FailureClass.OOM_HOST and (candidate.memory.cpu_memory or 0) > host_before:
            tried.append(f"{rung}: {lay.short()} offloads more host memory")
        elif lay.dp * lay.micro_batch * lay.grad_accum_steps != spec.training.global_batch:
            tried.append(f"{rung}: {lay.short()} changes the global batch")  # the planner never does
        else:
            note = (f"re-planned after {failure.value}: {failed.layout.short()} predicted"
                    f" {_mib(cap.predicted_bytes)} per rank"
                    + (f", measured {_mib(cap.measured_bytes)}" if cap.measured_bytes is not None else "")
                    + f"; memory capped at {_mib(cap.cap_bytes)} of tensors per rank ({rung} rung)")
            return Replan(plan=candidate.model_copy(update={"warnings": [*candidate.warnings, note]}),
                          rung=rung, cap=cap, tried=tried)
    return NoReplan(cap=cap, tried=tried)


def _mib(value: int | None) -> str:
    return "?" if value is None else f"{value / 2**20:.1f} MiB"


__all__ = ["FREED", "RUNGS", "MemoryCap", "NoReplan", "Replan", "Rung", "memory_cap", "next_plan",
           "predicted_allocated", "rung_pins"]
