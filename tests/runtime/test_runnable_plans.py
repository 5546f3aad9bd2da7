"""Every layout `plan()` can return is one the runtime accepts (pinning tp=2 on a small model once
gave `sharding: ddp` with tp=2, which the runtime refused after launch).

The runtime's own validation (`workers.runtime.parallelize.check_supported`, which applies
`service.planner.runnable`) is run against `plan()` over many random small specs and pins; a
layout that needs a runtime gap (offload, cp, fp8) may be chosen only when no layout the runtime
implements fits, and the plan must say so. A small sample of plans then really runs on gloo.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from service.planner import InvalidSpec, Plan, plan
from service.planner.runnable import layout_problems, runtime_gaps
from service.spec import TrainingSpec
from tests.runtime.harness import TINY_MODEL, Case, report, spec_dict, torchrun
from workers.runtime.errors import UnsupportedLayout
from workers.runtime.parallelize import check_supported

CPU = torch.device("cpu")

models = st.fixed_dictionaries({
    "layers": st.sampled_from([2, 4, 6, 8]), "heads": st.sampled_from([4, 8]), "group": st.sampled_from([1, 2, 4]),
    "head_dim": st.sampled_from([16, 32]), "ffn_mult": st.sampled_from([2, 3, 4]),
    "vocab": st.sampled_from([256, 1000, 32000]), "seq_len": st.sampled_from([32, 128, 1024, 4096]),
})
pins = st.fixed_dictionaries({}, optional={
    "tp": st.sampled_from([1, 2, 4]), "pp": st.sampled_from([1, 2]), "cp": st.sampled_from([1, 2]),
    "sharding": st.sampled_from(["ddp", "zero1", "zero2", "zero3", "fsdp", "hsdp"]),
    "activation_checkpointing": st.sampled_from(["none", "selective", "op", "full"]),
    "pipeline_schedule": st.sampled_from(["gpipe", "1f1b", "interleaved"]),
    "micro_batch": st.sampled_from([1, 2]),
})


def _spec(model: dict[str, int], world: int, nodes: int, gpu: str, precision: str, attention: str,
          batch: int, layout: dict[str, Any]) -> TrainingSpec:
    heads = model["heads"]
    return TrainingSpec.model_validate({
        "name": "prop",
        "model": {"layers": model["layers"], "hidden": heads * model["head_dim"], "heads": heads,
                  "kv_heads": max(1, heads // model["group"]),
                  "ffn_hidden": heads * model["head_dim"] * model["ffn_mult"],
                  "vocab": model["vocab"], "seq_len": model["seq_len"]},
        "training": {"global_batch": batch, "precision": precision, "attention": attention, "optimizer": "adamw"},
        "resources": {"gpu": gpu, "gpus_per_node": world // nodes, "nodes": nodes},
        "layout": layout,
    })


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=models, world=st.sampled_from([1, 2, 4, 8]), two_nodes=st.booleans(),
       gpu=st.sampled_from(["cpu", "A100-SXM-40GB", "H100-SXM-80GB", "L40S-48GB"]),
       precision=st.sampled_from(["fp32", "bf16", "fp16"]), attention=st.sampled_from(["flash", "eager"]),
       batch=st.sampled_from([4, 8, 16]), layout=pins)
def test_every_layout_plan_returns_is_accepted_by_the_runtime(model: dict[str, int], world: int, two_nodes: bool,
                                                               gpu: str, precision: str, attention: str, batch: int,
                                                               layout: dict[str, Any]) -> None:
    nodes = 2 if two_nodes and world >= 2 else 1
    try:
        spec = _spec(model, world, nodes, gpu, precision, attention, batch, layout)
        p = plan(spec)
    except (InvalidSpec, ValueError):
        assume(False)
        return
    shape = p.shape
    assert not layout_problems(p.layout, precision=precision, attention=attention, shape=shape), p.layout.short()
    gaps = runtime_gaps(p.layout, precision=precision)
    if not gaps:
        check_supported(p.layout, precision, CPU, shape, attention)  # the runtime's own validation
        for alt in p.alternatives:
            if not runtime_gaps(alt.layout, precision=precision):
                check_supported(alt.layout, precision, CPU, shape, attention)
        return
    # A gap: the runtime refuses it, the plan says so, and nothing the runtime implements fits.
    with pytest.raises(UnsupportedLayout):
        check_supported(p.layout, precision, CPU, shape, attention)
    assert any("not implemented" in w for w in p.warnings)
    if p.fits and precision != "fp8" and "offload" not in layout and "cp" not in layout:
        try:
            runnable_only = plan(spec.model_copy(update={"layout": spec.layout.model_copy(
                update={"offload": "none", "cp": 1})}))
        except InvalidSpec:
            return
        assert not runnable_only.fits, (p.layout.short(), runnable_only.layout.short())


def _run(tmp: Path, p: Plan) -> dict[str, Any]:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "plan.json").write_text(p.model_dump_json())
    case = Case(plan=tmp / "plan.json", out=tmp / "out", world=p.world_size)
    done = torchrun(case, "--no-profile", timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    return report(case)


@pytest.mark.parametrize(("world", "pinned"), [
    pytest.param(2, {"tp": 2}, id="tp2-pinned"),  # planned as sharding ddp before: refused after launch
    pytest.param(2, {"pp": 2, "sharding": "fsdp"}, id="pp2-fsdp-pinned"),
])
def test_a_sample_of_planned_layouts_really_runs_on_gloo(tmp_path: Path, world: int, pinned: dict[str, Any]) -> None:
    spec = TrainingSpec.model_validate({**spec_dict(world, global_batch=8, steps=2), "layout": pinned})
    p = plan(spec)
    assert p.fits and not runtime_gaps(p.layout, precision="fp32")
    for key, value in pinned.items():
        assert getattr(p.layout, key) == value
    data = _run(tmp_path, p)
    assert data["status"] == "succeeded", data.get("error")
    assert [r["rank"] for r in data["ranks"]] == list(range(world))
    assert p.shape is not None and p.shape.hidden == TINY_MODEL["hidden"]
