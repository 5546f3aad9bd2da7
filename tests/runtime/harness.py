"""Helpers for the runtime tests: a tiny spec, its plan for a pinned layout, and a torchrun launcher."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.planner import Layout, estimate
from service.spec import TrainingSpec

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = Path(sys.executable).with_name("torchrun")
# A tiny Llama (RMSNorm, RoPE, GQA, SwiGLU), about 0.2M parameters, divisible by tp 2 and 4.
TINY_MODEL: dict[str, Any] = {"layers": 4, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn_hidden": 128,
                              "vocab": 256, "seq_len": 32}


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
