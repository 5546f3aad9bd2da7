"""Run under torchrun by `test_accumulation.py`: one optimizer step of a plan with gradient accumulation,
recording what each parameter's gradient is when the second micro-step's forward starts.

    torchrun --standalone --nproc_per_node=N tests/runtime/accum_probe.py PLAN_JSON OUT_DIR

Writes OUT_DIR/rank<r>.json: {"grads": [[local elements, global elements] or null, ...]} per parameter.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from service.planner import Plan
from workers.runtime.mesh import build_mesh, init_distributed
from workers.runtime.model import Decoder
from workers.runtime.parallelize import apply_plan


def main(plan_path: str, out: str) -> None:
    plan = Plan.model_validate_json(Path(plan_path).read_text())
    assert plan.shape is not None
    device = torch.device("cpu")
    init_distributed(device, 60)
    torch.manual_seed(0)
    model = Decoder(plan.shape)
    applied = apply_plan(model, plan, build_mesh(plan.layout, device), device=device)
    seen: list[list[list[int] | None]] = []

    def record(module: nn.Module, args: Any) -> None:
        grads: list[list[int] | None] = []
        for p in module.parameters():
            g = p.grad
            if g is None:
                grads.append(None)
            elif isinstance(g, DTensor):
                grads.append([g.to_local().numel(), g.numel()])
            else:
                grads.append([g.numel(), g.numel()])
        seen.append(grads)

    # prepend: before FSDP2's own pre-forward hook unshards the root's parameters (an unsharded
    # parameter has no .grad; the sharded one holds it).
    handle = applied.model.register_forward_pre_hook(record, prepend=True)
    layout = plan.layout
    batch = layout.micro_batch * layout.grad_accum_steps
    seq = plan.shape.seq_len
    inputs = torch.randint(0, plan.shape.vocab, (batch, seq))
    applied.train_step(inputs, torch.roll(inputs, -1, dims=1))
    handle.remove()
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / f"rank{dist.get_rank()}.json").write_text(json.dumps({"grads": seen[1]}))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
