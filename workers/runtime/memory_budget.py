"""Out of memory in the runtime: a per-process memory budget, and what a rank measured when it ran out.

- **The budget** (`--memory-budget BYTES`, or `$SHARDCTL_MEMORY_BUDGET`; `64MiB`, `2GiB` and plain bytes
  are read). On CUDA it is `torch.cuda.set_per_process_memory_fraction`: the caching allocator itself
  refuses past it with `torch.OutOfMemoryError`. On CPU, `MemoryBudget` counts the bytes of every live
  tensor storage (the model's, and each one an operator creates while it is active: activations,
  gradients, optimizer state) and raises `MemoryBudgetExceeded`, a `torch.OutOfMemoryError`, as soon as
  they pass the budget. The CPU budget is what makes out-of-memory recovery testable without a GPU: the
  bytes counted are tensor bytes, the part of the plan's memory model it predicts as `peak_allocated`.
- **What a rank measured** (`measured_of`): for `torch.OutOfMemoryError` (`oom_gpu`) the bytes the
  allocator held plus the allocation that failed (CUDA: `memory_allocated` plus "Tried to allocate";
  CPU: the budget's count), and what it could have held (the device's free plus reserved memory, or the
  budget); for `MemoryError` (`oom_host`) the process's peak resident size. `train.run` prints it as
  `service.failures.oom_line`, last, so the backend's log tail carries it to the dispatcher.
"""

from __future__ import annotations

import re
import resource
import sys
import weakref
from collections.abc import Iterable
from typing import Any

import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from service.failures import FailureClass, MeasuredOom

BUDGET_ENV = "SHARDCTL_MEMORY_BUDGET"
_UNITS = {"": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "kb": 10**3, "mb": 10**6, "gb": 10**9}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$", re.IGNORECASE)
_TRIED = re.compile(r"Tried to allocate (\d+(?:\.\d+)?) (B|KiB|MiB|GiB|TiB)")


def parse_bytes(text: str) -> int:
    """`64MiB`, `1.5GiB`, `500MB` or `1048576` as bytes; `ValueError` naming the accepted forms otherwise."""
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS or float(match.group(1)) <= 0:
        raise ValueError(f"memory budget {text!r}: give a positive size in bytes, or with a unit"
                         " (KiB, MiB, GiB, KB, MB, GB), e.g. 64MiB")
    return int(float(match.group(1)) * _UNITS[unit])


class MemoryBudgetExceeded(torch.OutOfMemoryError):
    """A CPU rank's live tensor bytes passed its budget: the same failure as a GPU running out of memory."""

    def __init__(self, held: int, requested: int, limit: int) -> None:
        super().__init__(f"CPU memory budget exceeded: {held + requested} bytes of live tensors (a new"
                         f" {requested}-byte tensor on top of {held}) but the budget is {limit} bytes")
        self.peak_bytes = held + requested
        self.limit_bytes = limit


class MemoryBudget(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Counts live tensor storages on CPU and raises `MemoryBudgetExceeded` past `limit` bytes.

    A storage is counted from when it is registered (`register`, for tensors made before the mode was
    entered) or first returned by an operator while the mode is active, until it is freed, at the size it
    had when an operator last returned it (FSDP resizes its unsharded parameters' storages in place). `peak`
    is the largest count seen. Only CPU storages count; others pass through."""

    def __init__(self, limit: int) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.limit = limit
        self.held = 0
        self.peak = 0
        self._live: dict[int, int] = {}

    def register(self, tensors: Iterable[torch.Tensor]) -> None:
        """Count tensors that exist already (the model's parameters and buffers)."""
        for t in tensors:
            self._count(t, check=False)

    def _free(self, key: int) -> None:
        self.held -= self._live.pop(key, 0)

    def _count(self, t: torch.Tensor, *, check: bool) -> None:
        if isinstance(t, DTensor):
            t = t.to_local()
        if t.device.type != "cpu" or t.is_meta:
            return
        try:
            storage = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # tensor subclasses without a storage of their own
            return
        key = id(storage)
        nbytes = int(storage.nbytes())
        known = self._live.get(key)
        grown = nbytes - (known or 0)
        if check and grown > 0 and self.held + grown > self.limit:
            raise MemoryBudgetExceeded(self.held, grown, self.limit)
        if known is None:
            weakref.finalize(storage, self._free, key)
        self._live[key] = nbytes
        self.held += grown
        self.peak = max(self.peak, self.held)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for value in tree_flatten(out)[0]:
            if isinstance(value, torch.Tensor):
                self._count(value, check=True)
        return out


def apply_cuda_budget(device: torch.device, limit: int) -> None:
    """Cap this process's CUDA caching allocator at `limit` bytes of the device's memory."""
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, limit / total), device)


def _tried_bytes(message: str) -> int:
    match = _TRIED.search(message)
    if match is None:
        return 0
    scale = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}[match.group(2)]
    return int(float(match.group(1)) * scale)


def measured_of(exc: BaseException, rank: int, device: torch.device | None,
                budget: int | None = None) -> MeasuredOom | None:
    """What this rank measured if `exc` is running out of memory (see the module's docstring), else None."""
    if isinstance(exc, MemoryBudgetExceeded):
        return MeasuredOom(failure=FailureClass.OOM_GPU, rank=rank, peak_bytes=exc.peak_bytes,
                           limit_bytes=exc.limit_bytes, source="cpu memory budget, live tensor bytes")
    if isinstance(exc, torch.OutOfMemoryError):
        peak, limit, source = 0, budget, "torch.OutOfMemoryError"
        if device is not None and device.type == "cuda":
            held = int(torch.cuda.memory_allocated(device))
            peak = max(int(torch.cuda.max_memory_allocated(device)), held + _tried_bytes(str(exc)))
            free, _ = torch.cuda.mem_get_info(device)
            could = int(torch.cuda.memory_reserved(device)) + int(free)
            limit = min(could, budget) if budget is not None else could
            source = "cuda allocated bytes"
        return MeasuredOom(failure=FailureClass.OOM_GPU, rank=rank, peak_bytes=peak, limit_bytes=limit,
                           source=source)
    if isinstance(exc, MemoryError):
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
        return MeasuredOom(failure=FailureClass.OOM_HOST, rank=rank, peak_bytes=int(rss), limit_bytes=None,
                           source="peak resident set size")
    return None
