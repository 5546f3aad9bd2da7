"""Calibration from measurements, pure part: the robust fit, the minimum, and plans that follow it."""

from __future__ import annotations

import pytest

from service.planner import plan
from service.planner.calibration import (
    MEMORY_FACTOR_RANGE,
    STEP_FACTOR_RANGE,
    Calibration,
    ReportedRun,
    Sample,
    family,
    fit,
    model_prediction,
    prediction_error,
    sample_of,
)
from service.planner.layout import Layout
from service.planner.result import Plan
from tests.conftest import make_spec

H100 = "H100-SXM-80GB"


def runs(fam: str, *, step: float = 1.0, memory: float = 1.0, n: int = 5, gpu: str = H100) -> list[Sample]:
    """`n` runs of `fam` measured at `step` x and `memory` x the model's prediction."""
    return [Sample(gpu=gpu, family=fam, predicted_step_s=2.0, measured_step_s=2.0 * step,
                   predicted_peak_bytes=4e10, measured_peak_bytes=4e10 * memory) for _ in range(n)]


def test_families_name_the_sharding_kind_and_each_parallel_dimension_in_use() -> None:
    def lay(**kw: object) -> Layout:
        fields: dict[str, object] = dict(dp=8, tp=1, pp=1, cp=1, sharding="ddp", dp_shard=1, sequence_parallel=False,
                                         micro_batch=1, grad_accum_steps=1, activation_checkpointing="none",
                                         pipeline_schedule=None, virtual_stages=1, offload="none")
        fields.update(kw)
        return Layout(**fields)  # type: ignore[arg-type]

    assert family(lay()) == "ddp"
    assert family(lay(sharding="zero2", tp=2)) == "zero+tp"
    assert family(lay(sharding="hsdp", tp=2, pp=2, cp=2, offload="optimizer")) == "fsdp+tp+pp+cp+offload"
    assert family(lay(sharding="zero3").to_dict()) == "fsdp"  # a report's layout dict names the same family


def test_a_few_wild_runs_do_not_move_the_factor() -> None:
    steady = [Sample(gpu=H100, family="fsdp", predicted_step_s=1.0, measured_step_s=1.2 + 0.01 * (i % 3 - 1),
                     predicted_peak_bytes=1e10, measured_peak_bytes=1.05e10) for i in range(10)]
    wild = [Sample(gpu=H100, family="fsdp", predicted_step_s=1.0, measured_step_s=s, predicted_peak_bytes=1e10,
                   measured_peak_bytes=m) for s, m in ((12.0, 5e10), (9.0, 4e10), (0.01, 1e8))]
    [group] = fit(steady + wild).groups
    assert group.runs == 13
    assert group.step is not None and group.memory is not None
    assert group.step.value == pytest.approx(1.2, abs=0.011)
    assert group.memory.value == pytest.approx(1.05)
    assert group.step.error_after < group.step.error_before
    # The same steady runs alone give the same factor: the outliers changed nothing.
    [alone] = fit(steady).groups
    assert alone.step is not None and alone.step.value == pytest.approx(group.step.value, abs=0.011)


def test_factors_are_kept_apart_per_gpu_kind_and_family() -> None:
    cal = fit(runs("ddp", step=1.5) + runs("fsdp", step=0.8) + runs("ddp", step=2.0, gpu="A100-SXM-80GB"))
    assert cal.step_factor(H100, "ddp") == pytest.approx(1.5)
    assert cal.step_factor(H100, "fsdp") == pytest.approx(0.8)
    assert cal.step_factor("A100-SXM-80GB", "ddp") == pytest.approx(2.0)
    assert cal.step_factor(H100, "zero") == 1.0  # never measured


def test_only_the_newest_window_of_runs_counts() -> None:
    cal = fit(runs("ddp", step=3.0, n=10) + runs("ddp", step=1.1, n=6), window=6)
    assert cal.step_factor(H100, "ddp") == pytest.approx(1.1)


def test_without_calibration_a_plan_is_the_models_and_says_nothing_of_it() -> None:
    bare = plan(make_spec())
    assert bare.calibration is None
    assert not any("alibrat" in line for line in bare.explanation)


def test_below_the_minimum_runs_no_factor_is_used_and_the_plan_says_so() -> None:
    bare = plan(make_spec())
    few = fit(runs(family(bare.layout), step=1.5, memory=1.3, n=4))
    planned = plan(make_spec(), calibration=few)
    assert planned.layout == bare.layout and planned.time.step_s == bare.time.step_s
    assert planned.calibration is not None and not planned.calibration.used
    assert planned.calibration.runs == 4 and planned.calibration.min_runs == 5
    assert planned.calibration.step_factor == 1.0 and planned.calibration.memory_factor == 1.0
    assert any(line.startswith("Not calibrated") and "(zero: 4)" in line for line in planned.explanation)
    # One more run and the factor is used.
    planned = plan(make_spec(), calibration=fit(runs(family(bare.layout), step=1.5, memory=1.3, n=5)))
    assert planned.calibration is not None and planned.calibration.used


def test_a_family_measured_slower_loses_the_ranking_to_one_measured_as_predicted() -> None:
    bare = plan(make_spec())
    slow = family(bare.layout)
    planned = plan(make_spec(), calibration=fit(runs(slow, step=1.5)))
    assert family(planned.layout) != slow
    use = planned.calibration
    assert use is not None and use.used and use.step_factor == 1.0 and use.families == 1
    # The new choice is faster than the earlier one at its measured pace.
    assert planned.time.step_s < 1.5 * bare.time.step_s
    # Measured faster than predicted: the family stays chosen and its step time shrinks.
    quick = plan(make_spec(), calibration=fit(runs(slow, step=0.8)))
    assert quick.layout == bare.layout
    assert quick.time.step_s == pytest.approx(0.8 * bare.time.step_s)
    assert quick.calibration is not None and quick.calibration.model_step_s == pytest.approx(bare.time.step_s)
    assert any(line.startswith("Calibrated from 5 measured runs of zero") for line in quick.explanation)


def test_memory_measured_higher_takes_a_layout_out_of_the_fit() -> None:
    bare = plan(make_spec())
    fam = family(bare.layout)
    limit = bare.memory.gpu_memory
    assert bare.memory.total * 1.3 > limit  # the model says it fits; measurements say it would not
    planned = plan(make_spec(), calibration=fit(runs(fam, memory=1.3)))
    assert family(planned.layout) != fam and planned.fits
    assert planned.calibration is not None and planned.calibration.memory_total <= limit


def test_memory_measured_lower_lets_a_faster_layout_fit() -> None:
    bare = plan(make_spec())
    fam = family(bare.layout)
    planned = plan(make_spec(), calibration=fit(runs(fam, memory=0.7)))
    assert planned.time.step_s < bare.time.step_s
    assert planned.memory.total > bare.memory.total  # the model's bytes: more than it would have allowed
    use = planned.calibration
    assert use is not None and use.memory_factor == pytest.approx(0.7)
    # The factor scales what was measured, the allocated bytes; the runtime's fixed overhead stays.
    fixed = planned.memory.runtime_overhead
    assert fixed > 0
    assert use.memory_total == pytest.approx(0.7 * (planned.memory.total - fixed) + fixed, rel=1e-6)
    assert use.memory_total <= planned.memory.gpu_memory
    # Its warnings speak of the calibrated bytes: no "only -12% of GPU memory free".
    assert not any("% of GPU memory free" in w and "-" in w.split("%")[0] for w in planned.warnings)


def test_when_calibrated_memory_fits_nowhere_the_plan_says_so_with_the_calibrated_bytes() -> None:
    spec = make_spec(resources={"gpus_per_node": 2}, layout={"offload": "none"})
    bare = plan(spec)
    assert bare.fits
    families = [f"{kind}{dims}" for kind in ("ddp", "zero", "fsdp") for dims in ("", "+tp", "+pp", "+tp+pp")]
    planned = plan(spec, calibration=fit([s for fam in families for s in runs(fam, memory=1.5)]))
    assert not planned.fits
    assert any("per GPU calibrated" in reason for reason in planned.reasons)
    assert planned.min_gpus_to_fit is None  # the model's own count (2) would contradict the verdict


def test_memory_measured_higher_still_finds_a_layout_that_fits_once_calibrated() -> None:
    # Llama 2 7B on one H100, measured at 1.3x the model's memory: a layout that fits once calibrated.
    spec = make_spec(model={"preset": "llama-2-7b"}, resources={"gpus_per_node": 1})
    fam = family(plan(spec).layout)
    planned = plan(spec, calibration=fit(runs(fam, memory=1.3)))
    assert planned.fits
    assert planned.calibration is not None and planned.calibration.memory_factor == pytest.approx(1.3)
    assert planned.calibration.memory_total <= planned.memory.gpu_memory


def report(status: str = "succeeded", *, step: float | None = 1.1, peak: float | None = 9e9) -> ReportedRun:
    """A report as a job's program posts it, with a forged prediction and layout (neither is read)."""
    run = ReportedRun.parse({
        "status": status, "plan": "p", "world_size": 8, "device": "cuda:0", "steps": 10,
        "layout": {"sharding": "ddp", "tp": 8, "pp": 1, "cp": 1, "offload": "none"},
        "predicted": {"params": 1, "grads": 1, "optimizer": 1, "peak_allocated": 1.0, "peak_reserved": 1.0,
                      "total": 1.0, "step_s": 1e-9, "tokens_per_s": 1.0, "mfu": 0.4},
        "measured": {"step_s": step, "peak": peak}, "ratios": {}})
    assert run is not None
    return run


def stored_plan() -> Plan:
    return plan(make_spec())


def test_a_sample_holds_the_stored_plans_own_prediction_and_layout_never_the_reports() -> None:
    planned = stored_plan()
    step, peak = model_prediction(planned)
    m = planned.memory
    assert step == planned.time.step_s and peak == m.total - m.runtime_overhead - m.allocator_margin
    sample = sample_of(report(step=step * 1.1, peak=peak * 0.9), planned, H100)
    assert sample is not None and sample.family == family(planned.layout) != "ddp+tp"
    assert sample.predicted_step_s == step and sample.measured_step_s == pytest.approx(step * 1.1)
    assert sample.predicted_peak_bytes == peak and sample.measured_peak_bytes == pytest.approx(peak * 0.9)
    assert sample_of(report("failed"), planned, H100) is None
    assert sample_of(report(step=None, peak=None), planned, H100) is None
    assert ReportedRun.parse({"step_s": 1.5}) is None  # not a runtime report


def test_a_sample_of_a_calibrated_plan_holds_the_models_prediction() -> None:
    bare = stored_plan()
    calibrated = plan(make_spec(), calibration=fit(runs(family(bare.layout), step=0.8)))
    assert calibrated.time.step_s == pytest.approx(0.8 * bare.time.step_s)
    sample = sample_of(report(step=bare.time.step_s), calibrated, H100)
    assert sample is not None and sample.predicted_step_s == pytest.approx(bare.time.step_s)


def test_a_measurement_100x_off_the_stored_prediction_gives_no_sample() -> None:
    planned = stored_plan()
    step, peak = model_prediction(planned)
    assert sample_of(report(step=step * 101, peak=peak * 101), planned, H100) is None
    forged = sample_of(report(step=step * 99, peak=peak * 0.5), planned, H100)
    assert forged is not None and forged.measured_step_s == pytest.approx(step * 99)


def test_factors_are_held_within_their_ranges_however_far_the_runs_measured() -> None:
    cal = fit(runs("ddp", step=99.0, memory=99.0) + runs("fsdp", step=0.01, memory=0.01))
    [ddp, fsdp] = cal.groups
    assert ddp.step is not None and ddp.step.value == STEP_FACTOR_RANGE[1] and ddp.step.capped
    assert ddp.memory is not None and ddp.memory.value == MEMORY_FACTOR_RANGE[1] and ddp.memory.capped
    assert fsdp.step is not None and fsdp.step.value == STEP_FACTOR_RANGE[0] and fsdp.step.capped
    assert fsdp.memory is not None and fsdp.memory.value == MEMORY_FACTOR_RANGE[0]
    [inside] = fit(runs("ddp", step=1.5, memory=1.3)).groups
    assert inside.step is not None and not inside.step.capped and inside.step.value == pytest.approx(1.5)


def test_a_jobs_prediction_error_is_measured_over_its_stored_plan() -> None:
    planned = stored_plan()
    step, peak = model_prediction(planned)
    data = report(step=step * 0.55, peak=peak * 0.9).model_dump() | {"predicted": {"step_s": 1e-9}}
    err = prediction_error(planned, data)
    assert err is not None
    assert err.predicted_step_s == planned.time.step_s
    assert err.step_ratio == pytest.approx(0.55) and err.step_error == pytest.approx(-0.45)
    assert err.predicted_peak_bytes == int(peak) and err.memory_ratio == pytest.approx(0.9)
    assert not err.calibrated
    assert prediction_error(planned, {"status": "succeeded"}) is not None
    assert prediction_error(planned, {"status": "succeeded"}).step_ratio is None  # type: ignore[union-attr]
    assert prediction_error(planned, None) is None


def test_the_minimum_is_validated() -> None:
    with pytest.raises(ValueError, match="min_runs"):
        Calibration(min_runs=0)
