"""Every layout family, real multi-process gloo runs of `python -m workers.runtime` under torchrun.

Each run trains the tiny decoder for 4 steps and is checked three ways:
- it exits 0 and reports every rank;
- equivalence: its loss curve equals the single-process fp32 run on the same data within 5e-5;
- memory truth: each rank's measured parameter, gradient and optimizer-state bytes equal the
  planner's prediction for that rank's pipeline stage (service.planner.memory), within 1%.
Each family also carries a twist (gradient accumulation, checkpointing) so the matrix stays small.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from service.planner.memory import model_state_bytes, stage_params
from service.planner.models import resolve_model
from service.spec import ModelSpec
from tests.runtime.harness import TINY_MODEL, Case, layout, make_case, report, torchrun
from tests.runtime.reference import reference_losses

STEPS = 4
LOSS_TOL = 5e-5

FAMILIES: list[Any] = [
    pytest.param(layout(sharding="ddp", dp=2, micro_batch=2, accum=2, ac="full"), id="ddp2-accum-full"),
    pytest.param(layout(sharding="zero1", dp=2, micro_batch=4), id="zero1-2"),
    pytest.param(layout(sharding="zero2", dp=2, micro_batch=2, accum=2, ac="selective"), id="zero2-2-accum-sel"),
    pytest.param(layout(sharding="fsdp", dp=2, micro_batch=4, ac="full"), id="fsdp2-full"),
    pytest.param(layout(sharding="fsdp", tp=2, sp=True, micro_batch=8), id="tp2-sp"),
    pytest.param(layout(sharding="ddp", pp=2, micro_batch=2, accum=4, schedule="1f1b", ac="full"),
                 id="pp2-1f1b-full"),
    pytest.param(layout(sharding="ddp", pp=2, micro_batch=2, accum=4, schedule="interleaved", virtual_stages=2),
                 id="pp2-interleaved-v2"),
    pytest.param(layout(sharding="ddp", dp=4, micro_batch=1, accum=2, ac="selective"), id="ddp4-accum-sel",
                 marks=pytest.mark.slow),
    pytest.param(layout(sharding="zero1", dp=4, micro_batch=1, accum=2), id="zero1-4-accum",
                 marks=pytest.mark.slow),
    pytest.param(layout(sharding="zero2", dp=4, micro_batch=2, ac="full"), id="zero2-4-full", marks=pytest.mark.slow),
    pytest.param(layout(sharding="zero3", dp=4, micro_batch=1, accum=2), id="zero3-4-accum", marks=pytest.mark.slow),
    pytest.param(layout(sharding="hsdp", dp=4, dp_shard=2, micro_batch=1, accum=2, ac="selective"),
                 id="hsdp-2x2-accum-sel",
                 marks=pytest.mark.slow),
    pytest.param(layout(sharding="fsdp", dp=2, tp=2, sp=True, micro_batch=2, accum=2), id="fsdp2xtp2-sp-accum",
                 marks=pytest.mark.slow),
    pytest.param(layout(sharding="ddp", dp=2, pp=2, micro_batch=2, accum=2, schedule="1f1b"), id="pp2xddp2",
                 marks=pytest.mark.slow),
    pytest.param(layout(sharding="fsdp", dp=2, pp=2, micro_batch=1, accum=4, schedule="gpipe", ac="full"),
                 id="pp2xfsdp2-gpipe-full", marks=pytest.mark.slow),
]


def predicted_states(case_layout: Any, coords: dict[str, int], precision: Any = "fp32") -> tuple[float, float, float]:
    """The planner's params/grads/optimizer bytes for the rank at `coords` (its pipeline stage).

    With interleaved stages a rank holds v chunks; the planner counts ceil(L/pp) layers per rank
    plus the embedding on rank 0 and the head on the last rank, which is what the chunks add up
    to when pp*v divides the layers."""
    shape = resolve_model(ModelSpec.model_validate(TINY_MODEL))
    stages = stage_params(shape, case_layout)
    last = coords.get("pp", 0) == case_layout.pp - 1
    psi = stages.last if last else stages.first
    st = model_state_bytes(psi, stages.largest_unit, case_layout, precision, "adamw")
    return st.params, st.grads, st.optimizer


def check_run(case: Case, case_layout: Any, expected_losses: list[float]) -> dict[str, Any]:
    data = report(case)
    assert data["status"] == "succeeded", data.get("error")
    assert [r["rank"] for r in data["ranks"]] == list(range(case.world))
    assert data["losses"] == pytest.approx(expected_losses, abs=LOSS_TOL)
    for r in data["ranks"]:
        params, grads, opt = predicted_states(case_layout, r["coords"])
        mem = r["memory"]
        assert mem["params"] == pytest.approx(params, rel=0.01), (r["rank"], "params")
        assert mem["grads"] == pytest.approx(grads, rel=0.01), (r["rank"], "grads")
        assert mem["optimizer"] == pytest.approx(opt, rel=0.01), (r["rank"], "optimizer")
        assert r["step_s"] > 0 and r["tokens_per_s"] > 0
    return data


@pytest.fixture(scope="module")
def expected() -> dict[int, list[float]]:
    """Reference losses by global batch size."""
    return {gb: reference_losses(STEPS, gb) for gb in (4, 8)}


@pytest.mark.parametrize("lay", FAMILIES)
def test_layout_matches_single_process_and_planner_memory(tmp_path: Path, lay: Any,
                                                          expected: dict[int, list[float]]) -> None:
    case = make_case(tmp_path, lay, steps=STEPS)
    done = torchrun(case, "--no-profile", timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    gb = lay.dp * lay.micro_batch * lay.grad_accum_steps
    check_run(case, lay, expected[gb])
