"""The run report (pydantic, the runtime's output contract) and the API reporter.

`DIR/report.json` is always written (by rank 0 on success, by the first failing rank on
failure). When `SHARDCTL_URL`, `SHARDCTL_JOB_ID` and `SHARDCTL_JOB_TOKEN` are set, heartbeats, the
final report and the profile summary are also posted to `POST /v1/jobs/{id}/measurements`.
Reaching the API is best effort: a failure is logged and training continues.
"""

from __future__ import annotations

import logging
import os
import traceback
from pathlib import Path
from typing import Any, Literal

import httpx
from pydantic import BaseModel, Field

from service import jobenv
from service.failures import MeasuredOom
from service.jobenv import MeasurementKind
from service.planner import Plan

log = logging.getLogger("workers.runtime")


class RankMemory(BaseModel):
    params: int = Field(description="Local parameter bytes (shards only).")
    grads: int
    optimizer: int = Field(description="Per-parameter optimizer state bytes (no scalar step counters).")
    optimizer_scalars: int = 0
    peak: int | None = Field(None, description="Peak bytes: CUDA max allocated, or MemTracker's live storages on CPU.")
    reserved: int | None = Field(None, description="CUDA max reserved (GPU only).")
    peak_source: str = "unavailable"


class RankReport(BaseModel):
    rank: int
    coords: dict[str, int]
    memory: RankMemory
    step_s: float | None
    tokens_per_s: float | None
    param_count_local: int = 0


class Predicted(BaseModel):
    """The plan's prediction for the most loaded rank (bytes, seconds)."""

    params: int
    grads: int
    optimizer: int
    peak_allocated: int = Field(description="memory.total minus runtime overhead and allocator margin.")
    peak_reserved: int = Field(description="memory.total minus runtime overhead.")
    total: int
    step_s: float
    tokens_per_s: float
    mfu: float


class RunError(BaseModel):
    rank: int
    type: str
    message: str
    traceback: str

    @classmethod
    def of(cls, rank: int, exc: BaseException) -> RunError:
        return cls(rank=rank, type=type(exc).__name__, message=str(exc),
                   traceback="".join(traceback.format_exception(exc)))


class Report(BaseModel):
    status: Literal["succeeded", "failed", "stopped", "preempted"]
    plan: str
    layout: dict[str, Any]
    world_size: int
    device: str
    steps: int = Field(description="Optimizer steps this attempt ran.")
    start_step: int = Field(0, description="The step this attempt resumed from (0: a fresh start).")
    losses: list[float] = Field(default_factory=list, description="Global mean loss of each step this attempt ran.")
    ranks: list[RankReport] = Field(default_factory=list)
    predicted: Predicted | None = None
    measured: dict[str, float | None] = Field(default_factory=dict, description="Most loaded rank / slowest step.")
    ratios: dict[str, float | None] = Field(default_factory=dict, description="measured / predicted.")
    mfu: float | None = None
    flop_convention: str = ""
    profile: dict[str, Any] | None = None
    profile_error: str | None = None
    traces: list[str] = Field(default_factory=list)
    error: RunError | None = None
    oom: MeasuredOom | None = Field(None, description="Set when the failing rank ran out of memory: its class"
                                    " (oom_gpu, oom_host), the peak it measured and the limit it hit.")


def predicted_of(plan: Plan) -> Predicted:
    m, t = plan.memory, plan.time
    return Predicted(params=m.params, grads=m.grads, optimizer=m.optimizer,
                     peak_allocated=m.total - m.runtime_overhead - m.allocator_margin,
                     peak_reserved=m.total - m.runtime_overhead, total=m.total,
                     step_s=t.step_s, tokens_per_s=t.tokens_per_s, mfu=t.mfu)


def _ratio(measured: float | None, predicted: float) -> float | None:
    return None if measured is None or predicted <= 0 else measured / predicted


def compare(ranks: list[RankReport], predicted: Predicted) -> tuple[dict[str, float | None], dict[str, float | None]]:
    """Measured values of the most loaded rank (max per component; slowest step) and their ratios."""
    def biggest(values: list[int | float | None]) -> float | None:
        known = [float(v) for v in values if v is not None]
        return max(known) if known else None

    measured = {
        "params": biggest([r.memory.params for r in ranks]),
        "grads": biggest([r.memory.grads for r in ranks]),
        "optimizer": biggest([r.memory.optimizer for r in ranks]),
        "peak": biggest([r.memory.peak for r in ranks]),
        "reserved": biggest([r.memory.reserved for r in ranks]),
        "step_s": biggest([r.step_s for r in ranks]),
    }
    step = measured["step_s"]
    measured["tokens_per_s"] = None
    if step:
        tps = [r.tokens_per_s for r in ranks if r.tokens_per_s is not None]
        measured["tokens_per_s"] = min(tps) if tps else None
    ratios = {
        "params": _ratio(measured["params"], predicted.params),
        "grads": _ratio(measured["grads"], predicted.grads),
        "optimizer": _ratio(measured["optimizer"], predicted.optimizer),
        "peak": _ratio(measured["peak"], predicted.peak_allocated),
        "reserved": _ratio(measured["reserved"], predicted.peak_reserved),
        "step_s": _ratio(measured["step_s"], predicted.step_s),
        "tokens_per_s": _ratio(measured["tokens_per_s"], predicted.tokens_per_s),
    }
    return measured, ratios


def write_report(out: Path, report: Report, *, exclusive: bool = False) -> bool:
    """Write `out/report.json` atomically. With `exclusive`, only if no report exists yet
    (the first failing rank's error wins); returns whether it was written."""
    out.mkdir(parents=True, exist_ok=True)
    target = out / "report.json"
    text = report.model_dump_json(indent=2)
    if exclusive:
        try:
            fd = os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        return True
    tmp = target.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(target)
    return True


class ApiReporter:
    """Posts measurements to the control plane when configured; never raises."""

    def __init__(self, url: str | None, job_id: str | None, token: str | None, timeout_s: float = 5.0) -> None:
        self.enabled = bool(url and job_id and token)
        self._url = f"{(url or '').rstrip('/')}/v1/jobs/{job_id}/measurements"
        self._client = httpx.Client(timeout=timeout_s, headers={"Authorization": f"Bearer {token}"}) \
            if self.enabled else None
        self.failures = 0

    @classmethod
    def from_env(cls) -> ApiReporter:
        """Reports go where the job contract (`service.jobenv`) says, when it gives all three names."""
        return cls(os.environ.get(jobenv.API_URL), os.environ.get(jobenv.JOB_ID), os.environ.get(jobenv.TOKEN))

    def post(self, kind: MeasurementKind, data: dict[str, Any]) -> bool:
        """POST one measurement; False (logged) when the API cannot be reached or refuses it."""
        if self._client is None:
            return False
        try:
            resp = self._client.post(self._url, json={"kind": kind, "data": data})
            resp.raise_for_status()
            return True
        except (httpx.HTTPError, OSError) as exc:
            self.failures += 1
            log.warning("could not post %s to %s: %s", kind, self._url, exc)
            return False

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
