"""A short `torch.profiler` window: skip `wait` steps, warm up, record `active` steps, one Chrome
trace per rank (`DIR/traces/rank<r>.json`), exported from `on_trace_ready` (exporting after the
cycle would find its events already cleared)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, schedule


class ProfileWindow:
    """Wraps the training loop; call `step()` after every optimizer step.

    Steps `[wait, wait + warmup + active)` of this attempt are inside the window (their
    times are not used for the step-time measurement); `in_window(k)` says which.
    """

    def __init__(self, out: Path, rank: int, device: torch.device, *, enabled: bool, wait: int, warmup: int,
                 active: int) -> None:
        self.path = out / "traces" / f"rank{rank}.json"
        self.enabled = enabled and active > 0
        self.wait = wait
        self.span = wait + warmup + active
        self.written = False
        self._prof: Any = None
        if not self.enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        activities = [ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        # record_shapes: collectives then carry their sizes, so the summary has bytes and bandwidth.
        self._prof = profile(activities=activities,
                             schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1),
                             record_shapes=True, on_trace_ready=self._export)

    def _export(self, prof: Any) -> None:
        prof.export_chrome_trace(str(self.path))
        self.written = True

    def in_window(self, k: int) -> bool:
        """Whether the attempt's k-th step (0-based) is profiled (warm-up or recorded)."""
        return self.enabled and self.wait <= k < self.span

    def context(self) -> contextlib.AbstractContextManager[Any]:
        return self._prof if self._prof is not None else contextlib.nullcontext()

    def step(self) -> None:
        if self._prof is not None:
            self._prof.step()
