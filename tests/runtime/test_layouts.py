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

from tests.runtime.harness import check_run, layout, make_case, torchrun
from tests.runtime.reference import reference_losses

STEPS = 4

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
