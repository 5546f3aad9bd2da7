"""Helpers for the runtime tests: a tiny spec, its plan for a pinned layout, a torchrun launcher, and
the check of a run's report against the single-process losses and the planner's memory prediction."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from service.planner import Layout, estimate
from service.planner.memory import model_state_bytes, stage_params
from service.planner.models import resolve_model
from service.spec import ModelSpec, TrainingSpec

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = Path(sys.executable).with_name("torchrun")
# A tiny Llama (RMSNorm, RoPE, GQA, SwiGLU), about 0.2M parameters, divisible by tp 2 and 4.
TINY_MODEL: dict[str, Any] = {"layers": 4, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn_hidden": 128,
                              "vocab": 256, "seq_len": 32}
#: how far a run's loss curve may be from the single-process fp32 run on the same data
LOSS_TOL = 5e-5


def spec_dict(world: int, *, global_batch: int = 8, precision: str = "fp32", steps: int = 4,
              gpu: str = "cpu") -> dict[str, Any]:
    return {"name": "runtime-test", "model": dict(TINY_MODEL),
            "training": {"global_batch": global_batch, "precision": precision, "optimizer": "adamw",
                         "steps": steps, "activation_checkpointing": "auto"},
            "resources": {"gpu": gpu, "gpus_per_node": world, "nodes": 1}}


def layout(*, sharding: str = "ddp", dp: int = 1, tp: int = 1, pp: int = 1, dp_shard: int | None = None,
           sp: bool = False, micro_batch: int = 4, accum: int = 1, ac: str = "none",
           schedule: str | None = None, virtual_stages: int = 1) -> Layout:
    if dp_shard is None:
        dp_shard = 1 if sharding == "ddp" else dp
    return Layout(dp=dp, tp=tp, pp=pp, cp=1, sharding=sharding, dp_shard=dp_shard,  # type: ignore[arg-type]
                  sequence_parallel=sp, micro_batch=micro_batch, grad_accum_steps=accum,
                  activation_checkpointing=ac,  # type: ignore[arg-type]
                  pipeline_schedule=schedule if pp > 1 else None,  # type: ignore[arg-type]
                  virtual_stages=virtual_stages, offload="none")


@dataclass
class Case:
    plan: Path
    out: Path
    world: int


def make_case(tmp: Path, lay: Layout, *, precision: str = "fp32", steps: int = 4, gpu: str = "cpu") -> Case:
    """A plan for `lay` (the plan alone is what the runtime runs). `gpu` names the hardware the plan is
    made for; the runtime still runs on CPU (the planner refuses fp16 for `gpu: cpu`, so fp16 cases plan for a GPU)."""
    world = lay.world_size
    gb = lay.dp * lay.micro_batch * lay.grad_accum_steps
    spec = TrainingSpec.model_validate(spec_dict(world, global_batch=gb, precision=precision, steps=steps,
                                                     gpu=gpu))
    plan = estimate(spec, lay)
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "plan.json").write_text(plan.model_dump_json(indent=2))
    return Case(plan=tmp / "plan.json", out=tmp / "out", world=world)


def env() -> dict[str, str]:
    e = dict(os.environ)
    e.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), SHARDCTL_LOG="WARNING")
    for k in ("SHARDCTL_URL", "SHARDCTL_JOB_ID", "SHARDCTL_JOB_TOKEN"):
        e.pop(k, None)
    return e


def torchrun(case: Case, *args: str, timeout: float = 120, extra_env: dict[str, str] | None = None
             ) -> subprocess.CompletedProcess[str]:
    """Run the runtime under `torchrun --standalone` with `case.world` processes."""
    cmd = [str(TORCHRUN), "--standalone", f"--nproc_per_node={case.world}", "-m", "workers.runtime",
           "--plan", str(case.plan), "--out", str(case.out), "--timeout-s", "30", *args]
    return subprocess.run(cmd, cwd=ROOT, env={**env(), **(extra_env or {})}, capture_output=True, text=True,
                          timeout=timeout, check=False)


def report(case: Case) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((case.out / "report.json").read_text())
    return data


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
