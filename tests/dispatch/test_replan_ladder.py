"""The out-of-memory ladder (`service.planner.replan`), pure: a spec, the layout that ran out of memory and
what it measured give the next layout; the global batch is kept, the rungs come in order, the new plan
predicts less than the cap, and the answer is the same every time it is asked."""

from __future__ import annotations

from typing import Any

import pytest

from service.failures import FailureClass, MeasuredOom
from service.planner import Layout, Plan, estimate
from service.planner.replan import RUNGS, NoReplan, Replan, memory_cap, next_plan, predicted_allocated
from service.spec import TrainingSpec
from tests.runtime.harness import spec_dict

#: Llama 3.1 8B on one 8 x H100 node (examples/llama3-8b-8xh100.yaml)
LLAMA_8B: dict[str, Any] = {
    "name": "llama3-8b", "model": {"preset": "llama-3.1-8b"},
    "training": {"global_batch": 32, "precision": "bf16", "optimizer": "adamw", "steps": 1000},
    "resources": {"gpu": "H100-SXM-80GB", "gpus_per_node": 8, "nodes": 1},
}


def spec_of(data: dict[str, Any], **layout: Any) -> TrainingSpec:
    return TrainingSpec.model_validate({**data, "layout": layout})


def lay(sharding: str, dp: int, tp: int, mb: int, ac: str, *, offload: str = "none") -> Layout:
    return Layout(dp=dp, tp=tp, pp=1, cp=1, sharding=sharding, dp_shard=1 if sharding == "ddp" else dp,  # type: ignore[arg-type]
                  sequence_parallel=tp > 1, micro_batch=mb, grad_accum_steps=32 // (dp * mb),
                  activation_checkpointing=ac, pipeline_schedule=None, virtual_stages=1,  # type: ignore[arg-type]
                  offload=offload)  # type: ignore[arg-type]


def replanned(spec: TrainingSpec, failed: Plan, failure: FailureClass = FailureClass.OOM_GPU,
              measured: MeasuredOom | None = None) -> Replan:
    result = next_plan(spec, failed, failure, measured)
    assert isinstance(result, Replan), result.reason
    new = result.plan.layout
    assert new.dp * new.micro_batch * new.grad_accum_steps == spec.training.global_batch  # the batch is kept
    assert result.plan.fits
    assert predicted_allocated(result.plan) < result.cap.cap_bytes <= predicted_allocated(failed)
    return result


#: (the layout that ran out of memory, the rung that answers it, what that rung changes)
LADDER = [
    (lay("zero2", 4, 2, 2, "none"), "micro_batch", lambda old, new: new.micro_batch < old.micro_batch),
    (lay("zero2", 4, 2, 1, "none"), "activation_checkpointing", lambda old, new: new.activation_checkpointing
     != "none"),
    (lay("zero2", 4, 2, 1, "full"), "sharding", lambda old, new: new.sharding == "fsdp"),
    (lay("fsdp", 4, 2, 1, "full"), "model_parallel", lambda old, new: (new.dp, new.tp, new.pp, new.cp)
     != (old.dp, old.tp, old.pp, old.cp)),
    (lay("fsdp", 1, 8, 1, "full"), "offload", lambda old, new: new.offload != "none"),
]


#: the same job running its own program, which may implement offload (the built-in trainer does not)
OWN_PROGRAM = {**LLAMA_8B, "entrypoint": {"command": ["python", "train.py"]}}


@pytest.mark.parametrize(("failed_layout", "rung", "changed"), LADDER, ids=[r for _, r, _ in LADDER])
def test_each_rung_answers_when_the_rungs_below_it_cannot(failed_layout: Layout, rung: str, changed: Any) -> None:
    spec = spec_of(OWN_PROGRAM)
    result = replanned(spec, estimate(spec, failed_layout))
    assert result.rung == rung
    assert [t.split(":")[0] for t in result.tried] == list(RUNGS[: RUNGS.index(rung)])  # every lower rung, in order
    assert changed(failed_layout, result.plan.layout), result.plan.layout.short()
    assert any("re-planned after oom_gpu" in w for w in result.plan.warnings)


def test_the_built_in_trainer_is_never_given_a_layout_it_does_not_implement() -> None:
    spec = spec_of(LLAMA_8B)
    result = next_plan(spec, estimate(spec, lay("fsdp", 1, 8, 1, "full")), FailureClass.OOM_GPU)
    assert isinstance(result, NoReplan)
    assert any(t.startswith("offload: ") and "built-in trainer does not implement" in t for t in result.tried)


def test_the_micro_batch_rung_changes_only_the_micro_batch_and_the_accumulation() -> None:
    spec = spec_of(LLAMA_8B)
    old = lay("zero2", 4, 2, 2, "none")
    new = replanned(spec, estimate(spec, old)).plan.layout
    assert (new.micro_batch, new.grad_accum_steps) == (1, 8)
    assert new.to_dict() | {"micro_batch": 2, "grad_accum_steps": 4} == old.to_dict()


def test_after_running_out_of_host_memory_the_ladder_never_offloads() -> None:
    spec = spec_of(LLAMA_8B)
    result = next_plan(spec, estimate(spec, lay("fsdp", 1, 8, 1, "full")), FailureClass.OOM_HOST)
    assert isinstance(result, NoReplan)
    assert "offload: not after running out of host memory" in result.reason
    assert [t.split(":")[0] for t in result.tried] == list(RUNGS)


def test_the_users_pins_stay_pinned() -> None:
    spec = spec_of(LLAMA_8B, sharding="zero2")  # the sharding rung cannot change it: the next rung answers
    result = replanned(spec, estimate(spec, lay("zero2", 4, 2, 1, "full")))
    assert result.rung == "model_parallel" and result.plan.layout.sharding == "zero2"


def test_a_measured_peak_above_the_prediction_scales_the_cap() -> None:
    spec = spec_of(LLAMA_8B)
    failed = estimate(spec, lay("zero2", 4, 2, 2, "none"))
    predicted = predicted_allocated(failed)
    # The model under-predicted by 1.5 and the device held 1.2 x the prediction: the next prediction must stay
    # under 1.2 / 1.5 = 0.8 of the failed one, so that 1.5 x it fits in what the device holds.
    measured = MeasuredOom(failure=FailureClass.OOM_GPU, rank=3, peak_bytes=int(predicted * 1.5),
                           limit_bytes=int(predicted * 1.2))
    cap = memory_cap(failed, measured)
    assert cap.scale == pytest.approx(1.5, rel=1e-6) and cap.cap_bytes == pytest.approx(0.8 * predicted, rel=1e-6)
    assert predicted_allocated(replanned(spec, failed, measured=measured).plan) < 0.8 * predicted
    # Measured below the prediction: the cap is what the device held, not the prediction.
    low = MeasuredOom(failure=FailureClass.OOM_GPU, rank=0, peak_bytes=int(predicted * 0.9),
                      limit_bytes=int(predicted * 0.7))
    assert memory_cap(failed, low).cap_bytes == int(predicted * 0.7) and memory_cap(failed, low).scale == 1.0
    # Nothing measured (the OOM killer): the cap is the failed prediction itself.
    assert memory_cap(failed, None).cap_bytes == predicted


def test_the_answer_is_the_same_every_time() -> None:
    spec = spec_of(LLAMA_8B)
    failed = estimate(spec, lay("zero2", 4, 2, 1, "none"))
    measured = MeasuredOom(failure=FailureClass.OOM_GPU, rank=1, peak_bytes=60 * 2**30, limit_bytes=79 * 2**30)
    first, second = (next_plan(spec, failed, FailureClass.OOM_GPU, measured) for _ in range(2))
    assert first.model_dump() == second.model_dump()


def test_a_cpu_rank_over_its_budget_gets_a_smaller_micro_batch() -> None:
    """The end-to-end case of `test_oom_replan.py`, pure: two CPU ranks, DDP, 4 sequences each, over a budget."""
    spec = spec_of(spec_dict(2, global_batch=8, steps=2), dp=2, sharding="ddp")
    failed = estimate(spec, Layout(dp=2, tp=1, pp=1, cp=1, sharding="ddp", dp_shard=1, sequence_parallel=False,
                                   micro_batch=4, grad_accum_steps=1, activation_checkpointing="none",
                                   pipeline_schedule=None, virtual_stages=1, offload="none"))
    measured = MeasuredOom(failure=FailureClass.OOM_GPU, rank=1, peak_bytes=5_300_000, limit_bytes=5_200_000)
    result = replanned(spec, failed, measured=measured)
    assert result.rung == "micro_batch" and result.plan.layout.micro_batch == 2
    assert result.cap.cap_bytes == 5_200_000
