"""A deterministic scheduling simulator: replays a trace of jobs through `engine.admit` in virtual time.

A trace is the pools-and-quotas file (`config_file.PoolsFile`) plus `settings` and `jobs`::

    pools: [{name: gpu, backend: local, gpu: H100-SXM-80GB, gpus: 16}]
    teams: {a: {weight: 1, flavors: {H100-SXM-80GB: {nominal: 0}}}}
    settings: {usage_half_life_s: 3600, preempt_grace_s: 30, checkpoint_every_s: 600}
    jobs:
      - {team: a, submit_s: 0, gpus: 2, duration_s: 3600, count: 50, every_s: 60}

Semantics: an admission cycle runs at every event (a submission, an end, a preempted job leaving);
an admitted job starts at once and runs `duration_s` (less what it had checkpointed before a
preemption). A preempted job keeps running for `preempt_grace_s` (as the dispatcher's notice), then
leaves, loses the work since its last periodic checkpoint (every `checkpoint_every_s` of run time)
and re-queues with its original `submitted_at`. Past usage (the fair-share history) decays with
`usage_half_life_s`. Nothing depends on a wall clock or randomness: the same trace gives the same
schedule, whose `digest` (sha256 of every start, preemption and end) says so.
"""

from __future__ import annotations

import hashlib
import heapq
import math
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from service.scheduling.config_file import PoolsFile, PoolsFileError
from service.scheduling.engine import admit
from service.scheduling.state import RunningJob, Snapshot, WaitingJob


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class TraceJob(_Strict):
    """One job (or `count` identical ones submitted `every_s` apart)."""

    id: int | None = Field(None, ge=1, description="Default: its position in the trace (1-based, after expansion).")
    team: str = Field(min_length=1)
    submit_s: float = Field(0.0, ge=0, description="Submission time, seconds after the trace starts.")
    gpus: int = Field(ge=1, le=1_000_000)
    duration_s: float = Field(gt=0, description="Run time it needs without interruption.")
    gpu: str | None = Field(None, description="GPU kind; default: the first pool's.")
    backend: str | None = Field(None, description="Default: the first pool's of that GPU kind.")
    priority: int = 0
    pool: str | None = None
    predicted_s: float | None = Field(None, gt=0, description="What the engine is told (default: duration_s).")
    count: int = Field(1, ge=1, le=100_000)
    every_s: float = Field(0.0, ge=0)


class TraceSettings(_Strict):
    usage_half_life_s: float = Field(3600.0, gt=0, description="Half-life of past usage in the fair share.")
    usage_blend: float = Field(0.5, ge=0, le=1)
    min_runtime_s: float = Field(600.0, ge=0)
    reserve_after_s: float = Field(900.0, ge=0)
    preempt_grace_s: float = Field(30.0, ge=0)
    checkpoint_every_s: float = Field(600.0, gt=0)
    horizon_s: float | None = Field(None, gt=0, description="Stop here (GPU time counted up to it); default: all done.")


class Trace(PoolsFile):
    settings: TraceSettings = Field(default_factory=TraceSettings)
    jobs: list[TraceJob] = Field(default_factory=list)

    @model_validator(mode="after")
    def _jobs_match_pools(self) -> Trace:
        if self.jobs and not self.pools:
            raise ValueError("pools: a trace with jobs needs at least one pool")
        names = {p.name for p in self.pools}
        for i, j in enumerate(self.jobs):
            if j.pool is not None and j.pool not in names:
                raise ValueError(f"jobs.{i}.pool: no pool named {j.pool!r}; use one of {', '.join(sorted(names))}")
        return self


class TeamResult(BaseModel):
    gpu_seconds: float = Field(description="GPU-seconds its jobs ran (lost work included), up to the horizon.")
    share: float = Field(description="Its fraction of all teams' GPU-seconds.")
    jobs: int
    finished: int
    mean_wait_s: float = Field(description="Submission to first start, over its started jobs.")
    max_wait_s: float
    preempted: int = Field(description="Times its jobs were preempted.")
    lost_gpu_seconds: float


class SimResult(BaseModel):
    teams: dict[str, TeamResult]
    end_s: float
    cycles: int
    preemptions: int
    never_started: list[int] = Field(description="Jobs that had not started by the end.")
    first_start: dict[int, float] = Field(description="Job id -> time of its first start.")
    submitted: dict[int, float]
    digest: str = Field(description="sha256 of the schedule (starts, preemptions, ends): equal traces, equal digests.")
    log: list[str] = Field(default_factory=list, description="The schedule, one event a line.")


def expand_jobs(trace: Trace) -> list[tuple[int, TraceJob, float, str, str]]:
    """(id, job, submit time, gpu kind, backend) for every job, `count` expanded, sorted by (submit, id)."""
    out: list[tuple[int, TraceJob, float, str, str]] = []
    n = 0
    for j in trace.jobs:
        gpu = j.gpu or trace.pools[0].gpu
        backend = j.backend or next((p.backend.value for p in trace.pools if p.gpu == gpu),
                                    trace.pools[0].backend.value)
        for k in range(j.count):
            n += 1
            job_id = (j.id + k) if j.id is not None else n
            out.append((job_id, j, j.submit_s + k * j.every_s, gpu, backend))
    ids = [o[0] for o in out]
    if len(set(ids)) != len(ids):
        raise ValueError("jobs: job ids collide; give explicit ids that do not overlap, or none")
    out.sort(key=lambda o: (o[2], o[0]))
    return out


class _Run:
    __slots__ = ("end", "gpu", "gpus", "id", "leaving", "pool", "priority", "remaining", "start", "team")

    def __init__(self, w: WaitingJob, pool: str, start: float, remaining: float) -> None:
        self.id, self.team, self.pool, self.gpu, self.gpus = w.id, w.team, pool, w.gpu, w.gpus
        self.priority = w.priority
        self.start = start
        self.remaining = remaining
        self.end = start + remaining
        self.leaving: float | None = None


def simulate(trace: Trace, *, keep_log: bool = False) -> SimResult:
    """Replay `trace` to its end (or `settings.horizon_s`); see the module's docstring."""
    st = trace.settings
    jobs = expand_jobs(trace)
    quota = {team: q for team, q in trace.teams.items()}
    remaining: dict[int, float] = {}
    waiting: dict[int, WaitingJob] = {}
    running: dict[int, _Run] = {}
    submitted: dict[int, float] = {}
    first_start: dict[int, float] = {}
    team_of: dict[int, str] = {}
    waiting_job_of: dict[int, WaitingJob] = {}
    gpu_s: dict[str, float] = {t: 0.0 for t in sorted({j[1].team for j in jobs} | set(quota))}
    lost: dict[str, float] = dict.fromkeys(gpu_s, 0.0)
    preempted_n: dict[str, int] = dict.fromkeys(gpu_s, 0)
    finished: dict[str, int] = dict.fromkeys(gpu_s, 0)
    usage: dict[str, dict[str, float]] = {}
    h = hashlib.sha256()
    log: list[str] = []
    events: list[float] = []
    horizon = st.horizon_s if st.horizon_s is not None else math.inf
    pending = list(reversed(jobs))  # pop() gives the next submission
    now = 0.0
    cycles = preemptions = 0

    def note(line: str) -> None:
        h.update(line.encode() + b"\n")
        if keep_log:
            log.append(line)

    def advance(to: float) -> None:
        dt = to - now
        if dt <= 0:
            return
        decay = 0.5 ** (dt / st.usage_half_life_s)
        for team_usage in usage.values():
            for k in team_usage:
                team_usage[k] *= decay
        for r in running.values():
            usage.setdefault(r.team, {}).setdefault(r.gpu, 0.0)
            usage[r.team][r.gpu] += r.gpus * dt
            gpu_s[r.team] += r.gpus * dt

    for j in jobs:
        heapq.heappush(events, j[2])
    while events:
        t = heapq.heappop(events)
        if t < now:
            continue
        if t > horizon:
            advance(horizon)
            now = horizon
            break
        advance(t)
        now = t
        while events and events[0] == t:
            heapq.heappop(events)
        # ends and departures of preempted jobs
        for r in sorted(running.values(), key=lambda r: r.id):
            if r.end <= now:
                del running[r.id]
                finished[r.team] += 1
                note(f"{now:.3f} end {r.id} {r.pool}")
            elif r.leaving is not None and r.leaving <= now:
                del running[r.id]
                ran = now - r.start
                kept = math.floor(ran / st.checkpoint_every_s) * st.checkpoint_every_s
                lost[r.team] += (ran - kept) * r.gpus
                remaining[r.id] = r.remaining - kept
                w = waiting_job_of[r.id]
                waiting[r.id] = w
                note(f"{now:.3f} requeue {r.id} kept {kept:.3f}")
        while pending and pending[-1][2] <= now:
            job_id, tj, sub, gpu, backend = pending.pop()
            w = WaitingJob(id=job_id, team=tj.team, backend=backend, gpu=gpu, gpus=tj.gpus, priority=tj.priority,
                           submitted_at=sub, pool=tj.pool, predicted_s=tj.predicted_s or tj.duration_s)
            waiting[job_id] = w
            waiting_job_of[job_id] = w
            submitted[job_id] = sub
            remaining[job_id] = tj.duration_s
            team_of[job_id] = tj.team
        if not waiting:
            continue
        snap = Snapshot.model_construct(
            now=now, pools=trace.pools, quotas=quota,
            running=[_running(r, now, st.checkpoint_every_s) for r in sorted(running.values(), key=lambda r: r.id)],
            waiting=[waiting[i] for i in sorted(waiting)],
            usage={t: dict(v) for t, v in usage.items()}, usage_blend=st.usage_blend,
            min_runtime_s=st.min_runtime_s, reserve_after_s=st.reserve_after_s, default_quota=None,
            eta_unknown_s=3600.0)
        d = admit(snap)
        cycles += 1
        for a in d.admitted:
            w = waiting.pop(a.job_id)
            r = _Run(w, a.pool, now, remaining[a.job_id])
            running[a.job_id] = r
            first_start.setdefault(a.job_id, now)
            heapq.heappush(events, r.end)
            note(f"{now:.3f} start {a.job_id} {a.pool} borrowed {a.borrowed}")
        for p in d.preempted:
            r = running[p.victim]
            if r.leaving is None:
                r.leaving = now + st.preempt_grace_s
                preemptions += 1
                preempted_n[r.team] += 1
                heapq.heappush(events, r.leaving if st.preempt_grace_s > 0 else math.nextafter(now, math.inf))
                note(f"{now:.3f} preempt {p.victim} for {p.by}")
    total = sum(gpu_s.values()) or 1.0
    teams: dict[str, TeamResult] = {}
    for team in gpu_s:
        ids = [i for i, tm in team_of.items() if tm == team]
        waits = [first_start[i] - submitted[i] for i in ids if i in first_start]
        teams[team] = TeamResult(
            gpu_seconds=round(gpu_s[team], 3), share=round(gpu_s[team] / total, 6), jobs=len(ids),
            finished=finished[team], mean_wait_s=round(sum(waits) / len(waits), 3) if waits else 0.0,
            max_wait_s=round(max(waits), 3) if waits else 0.0, preempted=preempted_n[team],
            lost_gpu_seconds=round(lost[team], 3))
    never = sorted(i for i in submitted if i not in first_start)
    return SimResult(teams=teams, end_s=now, cycles=cycles, preemptions=preemptions, never_started=never,
                     first_start=first_start, submitted=submitted, digest=h.hexdigest(), log=log)


def _running(r: _Run, now: float, every: float) -> RunningJob:
    ran = now - r.start
    ckpt = r.start + math.floor(ran / every) * every if ran >= every else None
    return RunningJob.model_construct(
        id=r.id, team=r.team, pool=r.pool, gpu=r.gpu, gpus=r.gpus, priority=r.priority, admitted_at=r.start,
        started_at=r.start, checkpoint_at=ckpt, remaining_s=r.end - now, preemptible=r.leaving is None)


def load_trace(path: str | Path) -> Trace:
    """Read a trace file (YAML/JSON); `PoolsFileError` when unreadable, `ValidationError` naming the field."""
    p = Path(path)
    try:
        data: Any = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise PoolsFileError(f"{p}: cannot read the trace: {exc}") from exc
    except yaml.YAMLError as exc:
        raise PoolsFileError(f"{p}: not valid YAML or JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise PoolsFileError(f"{p}: expected a mapping with pools, teams, settings and jobs")
    return Trace.model_validate(data)


__all__ = ["SimResult", "TeamResult", "Trace", "TraceJob", "TraceSettings", "expand_jobs", "load_trace", "simulate"]
