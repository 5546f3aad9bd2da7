"""Measurements on one rank: exact bytes of the local state shards, peak memory, step times.

Bytes are logical: `numel * element_size` of each *local* tensor (`DTensor.to_local()`), which is
what `torch.cuda.memory_allocated` would show for them apart from the caching allocator's 512-byte
rounding and FSDP2's padding of uneven shards. Optimizer state counts the per-parameter tensors
(Adam's `exp_avg` and `exp_avg_sq`, SGD's momentum); scalar `step` counters are counted apart.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from pydantic import BaseModel
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import DTensor


def local_bytes(t: torch.Tensor) -> int:
    """Bytes of this rank's part of `t` (a DTensor's local shard, or the tensor)."""
    local = t.to_local() if isinstance(t, DTensor) else t
    return int(local.numel() * local.element_size())


class StateBytes(BaseModel):
    params: int
    grads: int
    optimizer: int
    optimizer_scalars: int
    param_count_local: int


def optimizer_states(optimizer: torch.optim.Optimizer) -> Iterator[dict[Any, Any]]:
    """Per-parameter state dicts of `optimizer`; for ZeRO-1 only this rank's partition."""
    inner = optimizer.optim if isinstance(optimizer, ZeroRedundancyOptimizer) else optimizer
    yield from inner.state.values()


def state_bytes(params: Iterable[torch.nn.Parameter], optimizer: torch.optim.Optimizer) -> StateBytes:
    """Exact local bytes of parameters, gradients and optimizer state (call after `step`, before `zero_grad`)."""
    p_bytes = g_bytes = count = 0
    for p in params:
        p_bytes += local_bytes(p)
        count += (p.to_local() if isinstance(p, DTensor) else p).numel()
        if p.grad is not None:
            g_bytes += local_bytes(p.grad)
    o_bytes = scalars = 0
    for state in optimizer_states(optimizer):
        for value in state.values():
            if isinstance(value, torch.Tensor):
                if value.dim() == 0:
                    scalars += local_bytes(value)
                else:
                    o_bytes += local_bytes(value)
    return StateBytes(params=p_bytes, grads=g_bytes, optimizer=o_bytes, optimizer_scalars=scalars,
                      param_count_local=count)


class PeakTracker:
    """Peak memory of the steps run inside `track()`.

    CUDA: `max_memory_allocated` / `max_memory_reserved` since the first `track()`. CPU: the
    peak of live tensor storages that torch's `MemTracker` sees (every tensor the process creates
    while tracking, by category), over the tracked steps. `MemTracker` does not work with
    pipelining (autograd.grad inside the schedule) nor with a module called twice in one tracked
    window (gradient accumulation), so CPU peaks are not measured for pp > 1 or grad_accum_steps > 1;
    `source` then says why.
    """

    def __init__(self, device: torch.device, modules: list[torch.nn.Module], optimizer: torch.optim.Optimizer,
                 enabled: bool) -> None:
        self.device = device
        self.enabled = enabled
        self.peak: int | None = None
        self.reserved: int | None = None
        self.source = "unavailable"
        self._mt: Any = None
        if not enabled:
            return
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            self.source = "cuda.max_memory_allocated"
        else:
            from torch.distributed._tools.mem_tracker import MemTracker

            self._mt = MemTracker()
            self._mt.track_external(*modules, optimizer)
            self.source = "MemTracker (live tensor storages)"

    @contextlib.contextmanager
    def track(self) -> Iterator[None]:
        if not self.enabled or self._mt is None:
            yield
            return
        with self._mt:
            yield

    def finish(self) -> None:
        if not self.enabled:
            return
        if self.device.type == "cuda":
            self.peak = int(torch.cuda.max_memory_allocated(self.device))
            self.reserved = int(torch.cuda.max_memory_reserved(self.device))
        elif self._mt is not None:
            snap = self._mt.get_tracker_snapshot("peak")
            self.peak = int(sum(v.get("Total", 0) for v in snap.values()))
