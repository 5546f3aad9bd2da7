"""`SlurmBackend`: the `Backend` protocol on Slurm, by composing this package's parts.

- `render`/`submit`: `submission.build_submission` decides the submission once; `render` returns it
  serialised (secrets redacted, plan left out), `submit` sends that same object (`client.sbatch`).
- `find`: `squeue`, then `sacct`, for the newest job of that name run in this backend's attempt folder.
- `poll`: ONE `sacct` for all handles, plus at most one `squeue` (`accounting` merges them, `states`
  maps them); a failed job gets its log tail (`logs`), a pending one Slurm's reason and start
  estimate from that same squeue (`pending_reason`, `expected_start`).
- `cancel`: `scancel`, idempotent; `preempt`: the same `scancel` (SIGTERM, SIGKILL after KillWait).
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import ClassVar

from service.backend_options import time_limit_minutes
from workers.backends.base import ArtifactInfo, Handle, LaunchRequest, LogChunk, Observation, Rendered, RunState
from workers.backends.slurm import accounting, outputs
from workers.backends.slurm.client import SlurmClient
from workers.backends.slurm.logs import log_tail
from workers.backends.slurm.states import SlurmObservation, observe, with_output_evidence
from workers.backends.slurm.submission import (
    SlurmSubmission,
    SubmissionDefaults,
    build_submission,
    job_checkpoint_dir,
)


class SlurmBackend:
    """`Backend` for Slurm through submitit. Thread-compatible (no shared mutable state but `calls`).

    `folder` holds one directory per attempt name (`<folder>/<name>/`, mode 0700): submitit's pickle
    (which carries the job token), the sbatch script, the per-node logs and the job's `out/`. On a real
    cluster it must be on a file system shared with the compute nodes.
    """

    name = "slurm"
    #: sacct window for lookups by name (sacct without -j only searches since midnight by default)
    FIND_WINDOW: ClassVar[str] = "now-30days"

    def __init__(self, folder: Path, *, partition: str | None = None, default_time_limit: str = "01:00:00",
                 cpus_per_proc: int = 1, signal_delay_s: int = 60, python: str | None = None,
                 command_timeout_s: float = 60.0,
                 runner: Callable[..., subprocess.CompletedProcess[str]] | None = None) -> None:
        """`partition`: used when the spec names none (else Slurm's default partition).
        `default_time_limit`: used when the spec sets none (submitit would otherwise impose 5 minutes);
        a bad one is a `ValueError` here. `python`: the interpreter on the nodes (default: this one).
        `runner`: replaces `subprocess.run` for every query and scancel (tests and benchmarks count).
        """
        time_limit_minutes(default_time_limit)
        self.folder = Path(folder).resolve()
        self.defaults = SubmissionDefaults(python=python or sys.executable, partition=partition,
                                           default_time_limit=default_time_limit, cpus_per_proc=cpus_per_proc,
                                           signal_delay_s=signal_delay_s)
        self.cli = SlurmClient(runner, timeout_s=command_timeout_s)

    @property
    def calls(self) -> Counter[str]:
        """Slurm CLI calls made so far, per command."""
        return self.cli.calls

    def job_folder(self, name: str) -> Path:
        return self.folder / name

    # -- the submission ---------------------------------------------------------------------------

    def submission(self, req: LaunchRequest) -> SlurmSubmission:
        """What `submit(req)` would send. Raises `SubmissionRefused` for non-Slurm options."""
        return build_submission(req, self.job_folder(req.name), self.defaults)

    def render(self, req: LaunchRequest) -> Rendered:
        """The submission as data, without submitting: submitit's parameters and the sbatch script it
        writes, and what the launcher runs on each node (secrets `<redacted>`, the plan left out).
        `%j`/`%t` in paths are Slurm's job id and task id, filled at run time."""
        return Rendered(backend=self.name, name=req.name, content=self.submission(req).model_dump(mode="json"))

    def submit(self, req: LaunchRequest) -> Handle:
        """sbatch through submitit. Raises BackendUnavailable (nothing known to be submitted),
        TransientBackendError (Slurm cannot take it now) or SubmissionRefused (Slurm refused it). The
        caller should `find(req.name)` first (adopt-before-submit)."""
        submission = self.submission(req)
        Path(submission.folder).mkdir(parents=True, exist_ok=True, mode=0o700)
        job_checkpoint_dir(self.folder, req.job.job_id).mkdir(parents=True, exist_ok=True, mode=0o700)
        return Handle(name=req.name, backend_id=self.cli.sbatch(submission))

    # -- following submissions --------------------------------------------------------------------

    def find(self, name: str) -> Handle | None:
        """The newest Slurm job named `name` that this backend submitted (its WorkDir is this backend's
        attempt folder): `squeue` (live, no accounting lag), then `sacct` (finished, purged from squeue)."""
        mine = str(self.job_folder(name))
        ids = accounting.ids_in(self.cli.query(accounting.find_args(name, accounted=False)), mine)
        if not ids:
            out = self.cli.query(accounting.find_args(name, accounted=True, window=self.FIND_WINDOW))
            ids = accounting.ids_in(out, mine)
        return Handle(name=name, backend_id=str(max(ids))) if ids else None

    def poll(self, handles: Sequence[Handle]) -> dict[str, Observation]:
        """State of every handle, keyed by handle name: ONE sacct call (+ at most one squeue for jobs
        sacct does not list yet or may lag on). A name Slurm does not know at all is `MISSING`."""
        if not handles:
            return {}
        if all(h.backend_id for h in handles):
            args = accounting.sacct_args(ids=[h.backend_id for h in handles if h.backend_id])
        else:  # some ids unknown: one lookup by name for all handles
            args = accounting.sacct_args(names=[h.name for h in handles], window=self.FIND_WINDOW)
        records = accounting.parse_sacct(self.cli.query(args))
        ids = {h.name: h.backend_id or accounting.newest_named(records, h.name, str(self.job_folder(h.name)))
               for h in handles}
        lagging = [h.name for h in handles if accounting.lags(records.get(ids[h.name] or ""))]
        queued = self.cli.query(accounting.squeue_args(lagging)) if lagging else ""
        live, live_by_id = accounting.parse_squeue(queued), accounting.parse_squeue_by_id(queued)
        out: dict[str, Observation] = {}
        for h in handles:
            job_id = ids[h.name]
            # by id when known: another job of the same name (another service's, on a shared cluster) is newer
            current = live_by_id.get(job_id) if job_id else live.get(h.name)
            workdir = str(self.job_folder(h.name)) if job_id is None else None  # compared only without an id
            if current is not None and not accounting.belongs(current, job_id, workdir):
                current = None
            merged = accounting.merge(records.get(job_id or ""), current)
            if merged is None:
                out[h.name] = SlurmObservation(state=RunState.MISSING, job_id=job_id,
                                               reason="Slurm has no job by this id/name")
                continue
            obs = observe(merged)
            if obs.state == RunState.PENDING:  # Slurm's own reason and estimate, from the same squeue
                obs.pending_reason, obs.expected_start = accounting.pending_details(current, records.get(job_id or ""))
            if obs.state == RunState.FAILED:
                obs.log_tail = log_tail(self.job_folder(h.name), obs.job_id)
                obs = with_output_evidence(obs)  # an out-of-memory message makes it oom_gpu / oom_host
            out[h.name] = obs
        return out

    def cancel(self, handle: Handle) -> None:
        """scancel by id (by name when the id is unknown). Idempotent: a finished or unknown job is fine."""
        self.cli.scancel([handle.backend_id] if handle.backend_id else ["-n", handle.name])

    def preempt(self, handle: Handle, grace_s: float) -> None:
        """`scancel`: Slurm sends SIGTERM to every process of the job (the runtime checkpoints into the job's
        checkpoint folder, `job_checkpoint_dir`, and exits) and SIGKILLs what is left after the cluster's
        `KillWait` (`grace_s` cannot lengthen it; set KillWait to what a checkpoint needs). The Slurm job
        ends CANCELLED and never runs again on its own: the dispatcher reads the end of an attempt it
        preempted as `preempted`, the job gives its admission back, and when admission admits it again
        the next attempt is a fresh sbatch that resumes from the same checkpoint folder (one sbatch per
        attempt). Not `scontrol requeue`: Slurm would start the same job again by itself, outside
        admission, while the job still held its pool. Idempotent (a job already ended or unknown is fine);
        without an id (not yet known), by name. Preemption by Slurm's own scheduler (`PreemptMode=REQUEUE`)
        still requeues the same job, which `poll` reports as `requeues`."""
        self.cancel(handle)

    # -- outputs (`base.LogReading`; `outputs` reads the attempt folder) --------------------------------
    def read_logs(self, handle: Handle, *, rank: int | None, cursor: str | None, limit: int) -> LogChunk:
        return outputs.read_logs(self.job_folder(handle.name), handle.backend_id, rank=rank, cursor=cursor,
                                 limit=limit)

    def list_artifacts(self, handle: Handle) -> list[ArtifactInfo]:
        return outputs.list_artifacts(self.job_folder(handle.name))

    def read_artifact(self, handle: Handle, path: str, *, max_bytes: int) -> bytes:
        return outputs.read_artifact(self.job_folder(handle.name), path, max_bytes=max_bytes)
