"""Build small Kineto-shaped traces by hand for tests whose answers are computed on paper."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any


class TraceBuilder:
    """Events in µs (integers, so HTA's ns rounding does not apply)."""

    def __init__(self, rank: int = 0, world: int = 1, backend: str = "nccl") -> None:
        self.rank, self.world, self.backend = rank, world, backend
        self.events: list[dict[str, Any]] = []
        self.corr = 0

    def cpu(
        self,
        name: str,
        ts: float,
        dur: float,
        cat: str = "cpu_op",
        tid: int = 1,
        args: dict[str, Any] | None = None,
    ) -> TraceBuilder:
        self.events.append(
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "pid": 1,
                "tid": tid,
                "ts": ts,
                "dur": dur,
                "args": args or {},
            }
        )
        return self

    def step(self, n: int, ts: float, dur: float) -> TraceBuilder:
        return self.cpu(f"ProfilerStep#{n}", ts, dur, cat="user_annotation")

    def kernel(
        self,
        name: str,
        ts: float,
        dur: float,
        stream: int = 7,
        launch_ts: float | None = None,
        cat: str = "kernel",
        launch_dur: float = 2.0,
        args: dict[str, Any] | None = None,
    ) -> TraceBuilder:
        self.corr += 1
        lt = ts - 5 if launch_ts is None else launch_ts
        rt = "cudaMemcpyAsync" if cat == "gpu_memcpy" else "cudaLaunchKernel"
        self.cpu(rt, lt, launch_dur, cat="cuda_runtime", args={"correlation": self.corr})
        self.events.append(
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "pid": 0,
                "tid": stream,
                "ts": ts,
                "dur": dur,
                "args": {"stream": stream, "correlation": self.corr, **(args or {})},
            }
        )
        return self

    def document(self) -> dict[str, Any]:
        return {
            "schemaVersion": 1,
            "distributedInfo": {"backend": self.backend, "rank": self.rank, "world_size": self.world},
            "traceEvents": self.events,
        }

    def write(self, path: Path, gz: bool = False) -> Path:
        text = json.dumps(self.document())
        if gz:
            with gzip.open(path, "wt", encoding="utf-8") as fh:
                fh.write(text)
        else:
            path.write_text(text)
        return path
