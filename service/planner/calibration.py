"""Calibration from measurements: correction factors per GPU kind and layout family, fitted from
finished jobs' measured step time and peak memory, and applied to a search's candidates.

Pure: no store, no torch. The store (`service.store.calibration`) collects one `Sample` per
succeeded run; `fit` turns samples into a `Calibration`; `plan(spec, calibration=...)` applies it
through `apply`.

The rules (docs/planner.md, "Calibration"):

- **Family** (`family`): the sharding kind (`ddp`; `zero` for zero1/zero2; `fsdp` for zero3, fsdp
  and hsdp), then `+tp`, `+pp`, `+cp` for each parallel dimension above 1 and `+offload` when
  offloading, e.g. `fsdp+tp+pp`. Layouts of one family share their error's causes.
- **Samples**: a succeeded run's measured figures against the prediction of the plan the server
  stored for it (`sample_of`); nothing the job reports besides its measurements is read, and a
  measurement more than 100x off the prediction is dropped (`PLAUSIBLE_RATIO`).
- **Fit**: the factor is exp(median(ln(measured / predicted))) over a group's newest
  `window` runs, separately for step time and peak memory. A median moves only when half the runs
  move: a few wild runs (a noisy neighbour, a stuck rank) do not change it beyond the range of
  the others. The factor is then held within `STEP_FACTOR_RANGE` or `MEMORY_FACTOR_RANGE`.
- **Scope**: which runs a calibration is fitted from (one team's, or every team's) is the store's
  choice (`service.store.calibration`); this module fits whatever samples it is given.
- **Use**: a factor is used only when its group has at least `min_runs` runs (default 5); below
  that the plan is made as without calibration and says so.
- **Apply**: the step-time factor multiplies every part of a candidate's step time (so ranking and
  every sentence use the calibrated time); the memory factor multiplies its per-GPU allocated bytes
  (not the runtime's fixed overhead), and the calibrated total decides whether it fits and whether
  it leaves the minimum free.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, computed_field

from service.planner.layout import Layout
from service.planner.result import Plan
from service.planner.search import DIMENSIONS, Candidate, Context, SearchResult, choose
from service.planner.timing import StepTime

DEFAULT_MIN_RUNS = 5
DEFAULT_WINDOW = 200
_ZERO = {"zero1", "zero2"}
_FSDP = {"zero3", "fsdp", "hsdp"}


def family(layout: Layout | Mapping[str, Any]) -> str:
    """The layout family a calibration factor is kept for, e.g. `ddp`, `zero+tp`, `fsdp+tp+pp+offload`."""
    get = layout.get if isinstance(layout, Mapping) else (lambda k, d=None: getattr(layout, k, d))
    sharding = str(get("sharding", "ddp"))
    name = "zero" if sharding in _ZERO else "fsdp" if sharding in _FSDP else "ddp"
    for dim in ("tp", "pp", "cp"):
        if int(get(dim, 1) or 1) > 1:
            name += f"+{dim}"
    if str(get("offload", "none") or "none") != "none":
        name += "+offload"
    return name


class Sample(BaseModel):
    """One succeeded run: the model's prediction (before any calibration) and what was measured."""

    model_config = ConfigDict(frozen=True)

    gpu: str
    family: str
    predicted_step_s: float = Field(gt=0)
    measured_step_s: float | None = Field(None, gt=0)
    predicted_peak_bytes: float = Field(gt=0)
    measured_peak_bytes: float | None = Field(None, gt=0)


class Factor(BaseModel):
    """One fitted correction: measured = value x predicted, from `runs` runs.

    `error_before` and `error_after` are mean absolute percentage errors (0.12 = 12%) of those runs
    against the model and against the model times `value` (in-sample). `capped`: the runs' median
    lay outside the factor's range (`STEP_FACTOR_RANGE`, `MEMORY_FACTOR_RANGE`) and `value` is the
    range's nearest end."""

    value: float
    runs: int
    error_before: float
    error_after: float
    capped: bool = False


class GroupCalibration(BaseModel):
    """The factors of one GPU kind and layout family; `step`/`memory` None when no run measured it."""

    gpu: str
    family: str
    runs: int
    step: Factor | None = None
    memory: Factor | None = None


class Calibration(BaseModel):
    """Every group's factors and the minimum runs before a factor is used."""

    min_runs: int = Field(DEFAULT_MIN_RUNS, ge=1)
    groups: list[GroupCalibration] = Field(default_factory=list)

    def group(self, gpu: str, fam: str) -> GroupCalibration | None:
        return next((g for g in self.groups if g.gpu == gpu and g.family == fam), None)

    def step_factor(self, gpu: str, fam: str) -> float:
        """The step-time factor to apply, 1.0 below `min_runs`."""
        g = self.group(gpu, fam)
        return g.step.value if g is not None and g.step is not None and g.step.runs >= self.min_runs else 1.0

    def memory_factor(self, gpu: str, fam: str) -> float:
        """The memory factor to apply, 1.0 below `min_runs`."""
        g = self.group(gpu, fam)
        return g.memory.value if g is not None and g.memory is not None and g.memory.runs >= self.min_runs else 1.0

    def used_for(self, gpu: str) -> list[GroupCalibration]:
        """The groups of `gpu` with at least one factor at or above `min_runs`."""
        return [g for g in self.groups if g.gpu == gpu and any(
            f is not None and f.runs >= self.min_runs for f in (g.step, g.memory))]


def _factor(pairs: list[tuple[float, float]], bounds: tuple[float, float]) -> Factor | None:
    """The median-of-log-ratios fit of (predicted, measured) pairs, held within `bounds`."""
    pairs = [(p, m) for p, m in pairs if p > 0 and m > 0 and 0 < m / p < math.inf]  # m / p may under/overflow
    if not pairs:
        return None
    median = math.exp(statistics.median(math.log(m / p) for p, m in pairs))
    value = min(max(median, bounds[0]), bounds[1])
    before = statistics.fmean(abs(m / p - 1) for p, m in pairs)
    after = statistics.fmean(abs(m / (p * value) - 1) for p, m in pairs)
    return Factor(value=value, runs=len(pairs), error_before=before, error_after=after, capped=value != median)


def fit(samples: Iterable[Sample], *, min_runs: int = DEFAULT_MIN_RUNS, window: int = DEFAULT_WINDOW) -> Calibration:
    """Fit each (gpu, family) group's factors from its newest `window` samples (`samples` oldest first)."""
    grouped: dict[tuple[str, str], list[Sample]] = {}
    for s in samples:
        grouped.setdefault((s.gpu, s.family), []).append(s)
    groups = []
    for (gpu, fam), runs in sorted(grouped.items()):
        recent = runs[-window:]
        step = _factor([(s.predicted_step_s, s.measured_step_s) for s in recent if s.measured_step_s is not None],
                       STEP_FACTOR_RANGE)
        mem = _factor([(s.predicted_peak_bytes, s.measured_peak_bytes) for s in recent
                       if s.measured_peak_bytes is not None], MEMORY_FACTOR_RANGE)
        groups.append(GroupCalibration(gpu=gpu, family=fam, runs=len(recent), step=step, memory=mem))
    return Calibration(min_runs=min_runs, groups=groups)


def scale_time(t: StepTime, factor: float) -> StepTime:
    """Every part of a step time multiplied by `factor` (the traffic volumes stay)."""
    return dataclasses.replace(t, compute_s=t.compute_s * factor, recompute_s=t.recompute_s * factor,
                               comm_exposed_s=t.comm_exposed_s * factor, bubble_s=t.bubble_s * factor,
                               optimizer_s=t.optimizer_s * factor, offload_s=t.offload_s * factor)


def _with_limit(ctx: Context, limit: float) -> Context:
    moved = dataclasses.replace(ctx)
    # Context derives its limits from the cluster in __post_init__; only the search's copy moves.
    object.__setattr__(moved, "limit", int(limit))
    object.__setattr__(moved, "roomy", ctx.roomy * limit / ctx.limit)
    return moved


def search_contexts(ctx: Context, calibration: Calibration) -> list[Context]:
    """The contexts to search under so that calibration's choice is among the layouts found.

    First the GPU's limit divided by the smallest memory factor below 1 in use on this GPU kind:
    every layout that fits once calibrated is evaluated. The search's own bounds (a fitting
    sibling makes more offload "dominated"; the timing bound) then work on the model's figures,
    so when a factor above 1 is in use a second search runs under the limit divided by the largest:
    what it finds fits once calibrated whatever the family, so a fit the first search's bounds hid
    is still found. `apply` holds every layout to the GPU's own limit."""
    factors = [g.memory.value for g in calibration.used_for(ctx.cluster.gpu.name)
               if g.memory is not None and g.memory.runs >= calibration.min_runs]
    loosest, tightest = min([1.0, *factors]), max([1.0, *factors])
    out = [ctx if loosest >= 1.0 else _with_limit(ctx, ctx.limit / loosest)]
    if tightest > 1.0:
        out.append(_with_limit(ctx, ctx.limit / tightest))
    return out


def calibrate_candidate(ctx: Context, cand: Candidate, calibration: Calibration) -> Candidate:
    """`cand` with its family's factors applied: step time scaled, and the per-GPU total's allocated
    part (tensors and the allocator margin, not the runtime's fixed overhead) scaled; fit and tier
    decided on the scaled total against the GPU's own limit (`ctx.limit`)."""
    gpu, fam = ctx.cluster.gpu.name, family(cand.layout)
    # The factor was fitted on allocated bytes (tensors); the allocator margin follows them, the
    # runtime's fixed overhead (CUDA context, libraries) does not.
    overhead = cand.parts[0].overhead if cand.parts is not None else cand.mem.runtime_overhead
    total = (cand.total - overhead) * calibration.memory_factor(gpu, fam) + overhead
    fits = total <= ctx.limit
    step = calibration.step_factor(gpu, fam)
    time = None if cand.time is None else scale_time(cand.time, step)
    return Candidate(layout=cand.layout, fits=fits, total=total, parts=cand.parts, time=time,
                     built=cand.built, tier=ctx.tier(cand.layout, total) if fits else 0)


def apply(ctx: Context, results: list[SearchResult], calibration: Calibration) -> SearchResult:
    """The searches' fitting layouts re-ranked under calibration (`choose` again).

    `results` come from searches under `search_contexts` (the first one's counters are kept, the
    others add the layouts it did not time); layouts over the GPU's limit once calibrated count as
    out of memory, and when none is left the one closest to fitting is `closest`. The search's
    timing bound (`PRUNE_FACTOR`) worked on the model's own times: a family made much faster by
    calibration may have gone untimed."""
    result = results[0]
    timed = list(result.timed)
    seen = {c.layout for c in timed}
    for extra in results[1:]:
        timed += [c for c in extra.timed if c.layout not in seen]
        seen.update(c.layout for c in extra.timed)
    out = SearchResult(
        closest=result.closest, closest_ratio=result.closest_ratio, invalid=result.invalid,
        out_of_memory=result.out_of_memory, dominated=result.dominated, fitting=result.fitting,
        pruned=result.pruned, pruned_dimensions=set(result.pruned_dimensions),
        gap_dimensions=set(result.gap_dimensions), evaluated=result.evaluated,
        invalid_reasons=dict(result.invalid_reasons))
    out.fitting += len(timed) - len(result.timed)
    over: list[Candidate] = []
    for cand in timed:
        cal = calibrate_candidate(ctx, cand, calibration)
        if not cal.fits:
            out.out_of_memory += 1
            out.fitting -= 1
            over.append(cal)
            continue
        out.timed.append(cal)
        key, lay = cal.key(), cal.layout
        sig = (lay.dp, lay.tp, lay.pp, lay.cp, lay.sharding, lay.dp_shard, lay.offload)
        held = out.by_signature.get(sig)
        if held is None or key < held.key():
            out.by_signature[sig] = cal
        values = (lay.tp, lay.pp, lay.cp, lay.sharding, lay.activation_checkpointing, lay.offload)
        for dkey in zip(DIMENSIONS, values, strict=True):
            held = out.by_dimension.get(dkey)
            if held is None or key < held.key():
                out.by_dimension[dkey] = cal
    choose(ctx, out)
    if out.best is None and over:
        out.closest = min(over, key=lambda c: c.total)
        out.closest_ratio = out.closest.total / ctx.limit
    return out


#: The measured/predicted ratios a sample may have. The model is never off by 100x: a report
#: outside is broken or forged (a job's own program holds its token and may post any report), and
#: such a sample is dropped.
PLAUSIBLE_RATIO = (0.01, 100.0)
#: The range a fitted step-time factor is held to, however the runs measured.
STEP_FACTOR_RANGE = (0.1, 10.0)
#: The range a fitted memory factor is held to: calibration may at most halve or double the memory a
#: layout is said to need, so no set of reports can make a plan claim several times the GPU's memory.
MEMORY_FACTOR_RANGE = (0.5, 2.0)


class _Reported(BaseModel):
    """A report's part as the job's program posted it: finite numbers, every other field ignored."""

    model_config = ConfigDict(allow_inf_nan=False)


class _Measured(_Reported):
    step_s: float | None = None
    peak: float | None = None


class ReportedRun(_Reported):
    """The parts of a runtime report (`workers.runtime.report.Report`, posted as a `report`
    measurement) that calibration reads: whether the run succeeded and what it measured. The report's
    own `predicted` figures and `layout` are never read: the prediction and the layout are those of
    the plan the server stored for the job."""

    status: str
    measured: _Measured = Field(default_factory=_Measured)

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> ReportedRun | None:
        """The report, or None when it is not one (a malformed or foreign measurement)."""
        try:
            return cls.model_validate(data)
        except ValidationError:
            return None


def model_prediction(plan: Plan) -> tuple[float, float]:
    """The model's own step time (before any calibration the plan applied) and peak allocated bytes
    (`memory.total` less the runtime's overhead and the allocator margin, as the runtime measures)."""
    step = plan.calibration.model_step_s if plan.calibration is not None else plan.time.step_s
    m = plan.memory
    return step, float(m.total - m.runtime_overhead - m.allocator_margin)


def sample_of(report: ReportedRun, plan: Plan, gpu: str) -> Sample | None:
    """The calibration sample of a succeeded run of the stored `plan` on `gpu`, or None (failed,
    nothing measured, or every figure implausible). The sample holds the model's own prediction, so
    a calibration never fits its own corrections."""
    predicted_step, predicted_peak = model_prediction(plan)
    m = report.measured
    if report.status != "succeeded" or predicted_step <= 0 or predicted_peak <= 0:
        return None
    step = _plausible(m.step_s, predicted_step)
    peak = _plausible(m.peak, predicted_peak)
    if step is None and peak is None:
        return None
    return Sample(gpu=gpu, family=family(plan.layout), predicted_step_s=predicted_step, measured_step_s=step,
                  predicted_peak_bytes=predicted_peak, measured_peak_bytes=peak)


def _measured(value: float | None) -> float | None:
    """A measured figure, or None when nothing was measured (absent, or not above 0)."""
    return value if value is not None and value > 0 else None


def _plausible(measured: float | None, predicted: float) -> float | None:
    """`_measured(measured)` when its ratio to `predicted` is within `PLAUSIBLE_RATIO`, else None."""
    value = _measured(measured)
    low, high = PLAUSIBLE_RATIO
    return value if value is not None and low <= value / predicted <= high else None


class PredictionError(BaseModel):
    """A job's plan against its measurement: ratio = measured / predicted, error = ratio - 1."""

    predicted_step_s: float
    measured_step_s: float | None
    step_ratio: float | None
    predicted_peak_bytes: int = Field(description="The plan's peak allocated bytes on the most loaded rank.")
    measured_peak_bytes: int | None
    memory_ratio: float | None
    calibrated: bool = Field(description="The plan was calibrated from earlier runs (its figures include the factors).")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def step_error(self) -> float | None:
        """step_ratio - 1 (0.12: measured 12% slower than predicted)."""
        return None if self.step_ratio is None else self.step_ratio - 1

    @computed_field  # type: ignore[prop-decorator]
    @property
    def memory_error(self) -> float | None:
        """memory_ratio - 1."""
        return None if self.memory_ratio is None else self.memory_ratio - 1


def prediction_error(plan: Plan, report: Mapping[str, Any] | None) -> PredictionError | None:
    """The job's stored `plan` against what its newest `report` measured (None: no report, or not one).
    The prediction is the plan's own figures, calibrated where the plan was: its step time, and the
    model's peak allocated bytes times the memory factor it applied."""
    run = ReportedRun.parse(report) if report is not None else None
    if run is None:
        return None
    use = plan.calibration
    # Calibrated: its own figures carry a factor (`used` alone may mean other families re-ranked it).
    calibrated = use is not None and (use.step_factor != 1.0 or use.memory_factor != 1.0)
    predicted_step = plan.time.step_s
    predicted_peak = model_prediction(plan)[1] * (use.memory_factor if use is not None else 1.0)
    step, peak = _measured(run.measured.step_s), _measured(run.measured.peak)
    return PredictionError(
        predicted_step_s=predicted_step, measured_step_s=step,
        step_ratio=None if step is None or predicted_step <= 0 else step / predicted_step,
        predicted_peak_bytes=int(predicted_peak), measured_peak_bytes=None if peak is None else int(peak),
        memory_ratio=None if peak is None or predicted_peak <= 0 else peak / predicted_peak,
        calibrated=calibrated)


__all__ = ["DEFAULT_MIN_RUNS", "DEFAULT_WINDOW", "MEMORY_FACTOR_RANGE", "PLAUSIBLE_RATIO", "STEP_FACTOR_RANGE",
           "Calibration", "Factor", "GroupCalibration",
           "PredictionError", "ReportedRun", "Sample", "apply", "calibrate_candidate", "family", "fit",
           "model_prediction", "prediction_error", "sample_of", "scale_time", "search_contexts"]
