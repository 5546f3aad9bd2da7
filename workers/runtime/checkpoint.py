"""Distributed checkpoints with `torch.distributed.checkpoint` (DCP), so a requeued attempt resumes.

Layout on disk: `CKPT/step-000004/` holds one DCP checkpoint (every rank writes its shards);
`CKPT/latest` names the newest complete one and is written by rank 0 after a barrier, so a
checkpoint that was cut short is never resumed from. Model and optimizer state go through
`get_state_dict`/`set_state_dict` (DDP, FSDP2, TP and pipeline stages alike); ZeRO-1's optimizer
partitions are rank-local and saved beside it as `zero1-rank<r>.pt` (same world size required).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.distributed.optim import ZeroRedundancyOptimizer

from service.jobenv import CHECKPOINT_DIR
from workers.runtime.parallelize import Applied

# Flat optimizer state: `param_groups` become per-parameter entries keyed by FQN. Unflattened, the
# `optim.param_groups` list has the same key on every rank, so DCP saves one rank's copy; under
# pipeline parallelism the ranks hold different parameters, and every other stage would load
# param groups that name none of its parameters (found resuming an interleaved 1F1B run).
OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


def _module(applied: Applied) -> nn.Module:
    return applied.parts[0] if len(applied.parts) == 1 else nn.ModuleList(applied.parts)


def _state(applied: Applied) -> dict[str, Any]:
    model = _module(applied)
    if isinstance(applied.optimizer, ZeroRedundancyOptimizer):
        return {"model": get_state_dict(model, [])[0]}
    model_sd, optim_sd = get_state_dict(model, applied.optimizer, options=OPTIONS)
    return {"model": model_sd, "optim": optim_sd}


def root_for(out: Path, environ: Mapping[str, str] | None = None) -> Path:
    """Where this run's checkpoints live: `$SHARDCTL_CHECKPOINT_DIR` when the backend gives one (the local
    backend: one folder per job, shared by its attempts, so the attempt after a preemption resumes),
    else `out/checkpoints` (a Slurm requeue reruns in the same folder)."""
    source = os.environ if environ is None else environ
    return Path(source[CHECKPOINT_DIR]) if source.get(CHECKPOINT_DIR) else out / "checkpoints"


def latest_step(root: Path) -> int | None:
    """The step of the newest complete checkpoint under `root`, or None."""
    marker = root / "latest"
    if not marker.exists():
        return None
    meta = json.loads(marker.read_text(encoding="utf-8"))
    return int(meta["step"])


def save(root: Path, step: int, applied: Applied) -> Path:
    """Save after `step` completed optimizer steps; collective over all ranks."""
    path = root / f"step-{step:06d}"
    dcp_save(_state(applied), checkpoint_id=str(path))
    if isinstance(applied.optimizer, ZeroRedundancyOptimizer):
        torch.save(applied.optimizer.optim.state_dict(), path / f"zero1-rank{dist.get_rank()}.pt")
    dist.barrier()
    if dist.get_rank() == 0:
        tmp = root / "latest.tmp"
        tmp.write_text(json.dumps({"step": step, "path": path.name}), encoding="utf-8")
        tmp.replace(root / "latest")
    dist.barrier()
    return path


def load(root: Path, applied: Applied) -> int:
    """Load the newest complete checkpoint into `applied`; return its step (0 when there is none)."""
    step = latest_step(root)
    if step is None:
        return 0
    path = root / f"step-{step:06d}"
    state = _state(applied)
    dcp_load(state, checkpoint_id=str(path))
    model = _module(applied)
    if isinstance(applied.optimizer, ZeroRedundancyOptimizer):
        set_state_dict(model, [], model_state_dict=state["model"], optim_state_dict={})
        local = torch.load(path / f"zero1-rank{dist.get_rank()}.pt", weights_only=False)
        applied.optimizer.optim.load_state_dict(local)
    else:
        set_state_dict(model, applied.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                       options=OPTIONS)
    return step
