"""Mixed precision, real multi-process gloo runs on CPU, against the single-process fp32 reference.

What torch 2.13 supports on CPU (checked, not assumed): bf16 and fp16 autocast, FSDP2's
`MixedPrecisionPolicy` with bf16/fp16 parameters over gloo, `torch.amp.GradScaler("cpu")` and
`ShardedGradScaler(device="cpu")`. So nothing is refused on CPU; fp16 runs are planned for an H100
(the planner refuses `training.precision: fp16` for `gpu: cpu`) and then run on CPU.

Tolerance against the fp32 reference, per step, absolute. The loss is computed in fp32 from
low-precision logits; perturbing every logit by at most d moves a softmax cross-entropy by at most
2d, and rounding a logit z costs about u|z| (u: the unit roundoff). The tiny decoder's logits stay
well under 0.5 in magnitude over these few steps (normal(0, 0.02) init, lr 1e-3), so one step's
loss moves by about 2 * u * 0.5 = u; gradients stay fp32 (fp32 master parameters, fp32 reduce), so
the trajectories drift apart only slowly. Allowing about 1.25u:
- bf16, u = 2^-8 = 3.9e-3: 5e-3 (measured: at most 4e-4);
- fp16, u = 2^-11 = 4.9e-4: 1e-3 (measured: at most 5e-5; fp16 keeps 3 more mantissa bits).
Either is still far below what a broken gradient does to the curve within 6 steps (a rank training
on its half batch alone is off by 1e-2 at step 1, and the curve falls by 0.25 over the run).
The fp32 layouts match within 5e-5 (test_layouts.py).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.runtime.harness import layout, make_case, predicted_states, report, torchrun
from tests.runtime.reference import reference_losses

STEPS = 6
TOL = {"bf16": 5e-3, "fp16": 1e-3}
GPU_FOR = {"bf16": "cpu", "fp16": "H100-SXM-80GB"}


@pytest.fixture(scope="module")
def fp32_reference() -> list[float]:
    return reference_losses(STEPS, 8)


CASES: list[Any] = [
    pytest.param("ddp", "bf16", id="ddp2-bf16-autocast"),
    pytest.param("fsdp", "bf16", id="fsdp2-bf16-mp-policy"),
    pytest.param("ddp", "fp16", id="ddp2-fp16-gradscaler", marks=pytest.mark.slow),
    pytest.param("fsdp", "fp16", id="fsdp2-fp16-shardedgradscaler", marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("sharding", "precision"), CASES)
def test_mixed_precision_tracks_the_fp32_reference_with_fp32_master_state(
        tmp_path: Path, sharding: str, precision: str, fp32_reference: list[float]) -> None:
    lay = layout(sharding=sharding, dp=2, micro_batch=4)
    case = make_case(tmp_path, lay, precision=precision, steps=STEPS, gpu=GPU_FOR[precision])
    plan = (case.plan.read_text())
    assert f'"compute": "{precision}"' in plan and '"reduce": "fp32"' in plan
    done = torchrun(case, "--no-profile", "--device", "cpu", timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    data = report(case)
    assert data["status"] == "succeeded", data.get("error")
    losses = data["losses"]
    assert len(losses) == STEPS and all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0] - 0.1  # it learns (fp32: 5.54 -> 5.30)
    assert losses == pytest.approx(fp32_reference, abs=TOL[precision])
    # fp32 master parameters, fp32 gradients and fp32 Adam moments, as the planner assumes.
    for r in data["ranks"]:
        params, grads, opt = predicted_states(lay, r["coords"], precision)
        mem = r["memory"]
        assert mem["params"] == pytest.approx(params, rel=0.01), (r["rank"], "params")
        assert mem["grads"] == pytest.approx(grads, rel=0.01), (r["rank"], "grads")
        assert mem["optimizer"] == pytest.approx(opt, rel=0.01), (r["rank"], "optimizer")


def _applied_in_process(sharding: str, precision: str, tp: int = 1) -> Any:
    """apply_plan in this process on a one-rank gloo group (dp = tp = 1 here)."""
    from service.planner import estimate
    from service.planner.models import resolve_model
    from service.spec import TrainingSpec
    from tests.runtime.harness import spec_dict
    from workers.runtime import Decoder, apply_plan, build_mesh, init_distributed

    init_distributed(torch.device("cpu"), 30)
    lay = layout(sharding=sharding, dp=1, micro_batch=4)
    spec = TrainingSpec.model_validate(spec_dict(1, global_batch=4, precision=precision, gpu=GPU_FOR[precision]))
    plan = estimate(spec, lay)
    torch.manual_seed(0)
    model = Decoder(resolve_model(spec.model))
    return apply_plan(model, plan, build_mesh(lay, torch.device("cpu")), device=torch.device("cpu"))


@pytest.mark.parametrize(("sharding", "precision", "scaler"), [
    ("ddp", "bf16", None), ("fsdp", "bf16", None), ("ddp", "fp16", "GradScaler"),
    ("fsdp", "fp16", "GradScaler"),  # FSDP2 wrapped nothing: the plain scaler (multi-process: ShardedGradScaler)
])
def test_a_low_precision_plan_computes_in_low_precision_even_without_data_parallelism(
        sharding: str, precision: str, scaler: str | None) -> None:
    """With dp = 1 FSDP2 wraps nothing, so autocast must do the casting (it used not to: fp32 ran)."""
    import torch.distributed as dist

    try:
        applied = _applied_in_process(sharding, precision)
        tokens = torch.randint(0, 256, (2, 32))
        with applied.autocast():
            logits = applied.model(tokens)
        assert logits.dtype == {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
        assert type(applied.scaler).__name__ == scaler if scaler else applied.scaler is None
        loss = applied.train_step(tokens, tokens)
        assert loss is not None and math.isfinite(loss)
        assert all(p.dtype == torch.float32 and p.grad is not None and p.grad.dtype == torch.float32
                   for p in applied.parameters())
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
