"""Run under torchrun by `test_accumulation.py`: one optimizer step of a plan with gradient accumulation,
recording what each parameter's gradient is when the second micro-step's forward starts.

    torchrun --standalone --nproc_per_node=N tests/runtime/accum_probe.py PLAN_JSON OUT_DIR

Writes OUT_DIR/rank<r>.json: "grads", per parameter [local elements, global elements] or null; and, read
from FSDP2's parameter groups (torch 2.13's internals: the only place they are visible), "unsharded_accumulated"
(elements of unsharded gradients kept for accumulation: FSDPParam.unsharded_accumulated_grad, or the
unsharded parameter's .grad) and "partial_reduce"
(elements reduce-scattered but not yet all-reduced, HSDP's FSDPParamGroup._partial_reduce_output).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule
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
    seen: list[dict[str, Any]] = []

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
        unsharded = partial = 0
        for m in module.modules():
            group = m._get_fsdp_state()._fsdp_param_group if isinstance(m, FSDPModule) else None
            if group is None:
                continue
            for fp in group.fsdp_params:
                acc = getattr(fp, "unsharded_accumulated_grad", None)  # a reduce dtype below fp32
                unsharded += acc.numel() if acc is not None else 0
                param = getattr(fp, "_unsharded_param", None)  # the same dtype: the gradient stays here
                unsharded += param.grad.numel() if param is not None and param.grad is not None else 0
            out = group._partial_reduce_output
            partial += out.numel() if out is not None else 0
        seen.append({"grads": grads, "unsharded_accumulated": unsharded, "partial_reduce": partial})

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
    (Path(out) / f"rank{dist.get_rank()}.json").write_text(json.dumps(seen[1]))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
