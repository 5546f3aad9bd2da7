"""The backend protocol: one small interface that local processes, Slurm and Kubernetes implement.

The dispatcher builds a `LaunchRequest` for each attempt and only ever calls these methods:

- `render(req)`: the exact request as printable data (nothing is submitted); `submit` sends
  exactly what `render` returns, secrets filled in;
- `submit(req)`: submit it; the backend names the submission `req.name`;
- `find(name)`: the submission with that name, to adopt after a crash (None if there is none);
- `poll(handles)`: the state of many submissions in one call (one `sacct`, one labelled list);
- `cancel(handle)`: ask the backend to stop it (idempotent);
- `preempt(handle, grace_s)`: stop it with notice (SIGTERM, then a kill after the grace period), so it
  can checkpoint; it ends as `preempted` (idempotent).

Backends raise exactly three errors, and the dispatcher catches exactly these:

- `BackendUnavailable`: the backend did not answer. "Unknown for now", never a failed job;
- `TransientBackendError`: it answered but cannot take the request now; try again later;
- `SubmissionRefused`: it answered and refused this request for good; the job fails with the reason.

Anything else is a bug: it propagates, and the job's lease makes the next cycle try again.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, Field

from service.backend_options import BackendOptions, LocalOptions
from service.failures import FailureClass as FailureClass  # re-exported: what backends classify with
from service.jobenv import JobEnv
from service.joblogs import RANK_PREFIX_TEMPLATE
from service.joblogs import ArtifactInfo as ArtifactInfo  # the output contract, re-exported
from service.joblogs import LogChunk as LogChunk
from service.joblogs import LogLine as LogLine
from service.observation import Observation as Observation  # what `poll` answers, re-exported
from service.observation import RunState as RunState
from service.planner.result import Plan
from service.scheduling.kueue_names import KueueQueue


class BackendError(Exception):
    """Base of the three errors a backend may raise."""


class BackendUnavailable(BackendError):
    """The backend did not answer (network, controller down). Not a verdict on any job."""


class TransientBackendError(BackendError):
    """The backend answered but could not take the request now (a conflict, a quota, a busy API)."""


class SubmissionRefused(BackendError):
    """The backend answered and refused this request for good (bad partition, unmanaged namespace...)."""


class LaunchRequest(BaseModel):
    """Everything a backend needs to start one attempt of a job on every node."""

    job: JobEnv = Field(description="What every rank is given (plan, ids, token); see `service.jobenv`.")
    name: str = Field(description="Deterministic attempt name: shardctl-<job id>-<attempt>.")
    team: str
    nodes: int
    procs_per_node: int
    gpus_per_proc: int = Field(description="0 on the cpu kind.")
    command: list[str] = Field(description="The entrypoint each process runs (torchrun starts it).")
    user_env: dict[str, str] = Field(default_factory=dict, description="The spec's entrypoint.env.")
    image: str | None = None
    options: BackendOptions = Field(default_factory=LocalOptions, description="The spec's backend options.")
    kueue: KueueQueue | None = Field(None, description="Kubernetes: the job's pool is Kueue-managed; its"
                                     " LocalQueue and priority class (labels), and the workload starts suspended.")

    @property
    def job_id(self) -> int:
        return self.job.job_id

    @property
    def attempt(self) -> int:
        return self.job.attempt

    @property
    def plan(self) -> Plan:
        return self.job.plan

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    def environment(self, out_dir: str | None = None) -> dict[str, str]:
        """Every variable each rank gets: the user's, then the job contract's (which wins)."""
        job = self.job if out_dir is None else self.job.model_copy(update={"out_dir": out_dir})
        return {**self.user_env, **job.environ()}


#: The environment that makes a job's output readable while it runs: torchrun prefixes each teed line
#: with the global rank (see `torchrun_command`), and Python processes (torchrun, the ranks) write
#: each line when it is printed rather than when a buffer fills or the process ends.
LOG_ENV = {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": RANK_PREFIX_TEMPLATE, "PYTHONUNBUFFERED": "1"}


def attempt_name(job_id: int, attempt: int) -> str:
    return f"shardctl-{job_id}-{attempt}"


def runtime_command() -> list[str]:
    """The built-in entrypoint: the training runtime. It reads the `service.jobenv` contract.

    Commands name `python`, not this process's interpreter: a container has its own. Backends
    that run on this machine put this interpreter's directory first on PATH (`local_path_env`)."""
    return ["python", "-m", "workers.runtime"]


def local_path_env(env: Mapping[str, str], bindir: str | None = None) -> dict[str, str]:
    """`env` with `bindir` (default: this interpreter's bin directory) first on PATH, so `python` and
    `torchrun` are the service's."""
    bindir = bindir or str(Path(sys.executable).parent)
    return {**env, "PATH": bindir + os.pathsep + env.get("PATH", os.defpath)}


def torchrun_command(req: LaunchRequest, *, rdzv_endpoint: str, node_rank: str | None = None,
                     log_dir: str | None = None) -> list[str]:
    """`torchrun` for one node of the job: the plan's world, c10d rendezvous on the first node.

    `--no-python`: the entrypoint is a whole command line (`python -m ...`, a binary), not a script.
    `log_dir`: teed output (`--tee=3`): torchrun keeps each local rank's stdout and stderr in files under
    `log_dir` and copies every line to its own stdout/stderr behind a rank prefix (`[rank<global
    rank>]:` with `LOG_ENV` in the environment), which is how the backends' log readers tell
    the ranks apart in a node's merged output."""
    args = ["python", "-m", "torch.distributed.run", "--no-python", f"--nnodes={req.nodes}",
            f"--nproc-per-node={req.procs_per_node}", "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}",
            f"--rdzv-id={req.name}", "--max-restarts=0"]
    if node_rank is not None:
        args.append(f"--node-rank={node_rank}")
    if log_dir is not None:
        args += ["--tee=3", f"--log-dir={log_dir}"]
    return [*args, *req.command]


class Handle(BaseModel):
    """A submission the backend knows: its name and the backend's own id for it."""

    name: str
    backend_id: str | None = None


class Rendered(BaseModel):
    """The exact request a backend would send, as data: printable, comparable in golden files."""

    backend: str
    name: str
    content: dict[str, Any]


@runtime_checkable
class Backend(Protocol):
    name: str

    def render(self, req: LaunchRequest) -> Rendered: ...

    def submit(self, req: LaunchRequest) -> Handle: ...

    def find(self, name: str) -> Handle | None: ...

    def poll(self, handles: Sequence[Handle]) -> dict[str, Observation]: ...

    def cancel(self, handle: Handle) -> None: ...

    def preempt(self, handle: Handle, grace_s: float) -> None:
        """Ask the backend to stop the submission WITH NOTICE, so the job can checkpoint: its processes get
        SIGTERM and are killed `grace_s` later, as far as the backend can honour it. The submission then
        ends as `preempted` and never runs again by itself (the job's next admission submits anew).
        Idempotent. Local: SIGTERM to the process group, SIGKILL after `grace_s`; Kubernetes: delete
        with `gracePeriodSeconds`; Slurm: `scancel` (the grace is the cluster's KillWait)."""
        ...


@runtime_checkable
class LogReading(Protocol):
    """What a backend that can show a job's outputs adds to `Backend` (optional; each method reads the
    backend's own files or API, never a copy):

    - `read_logs(handle, rank=, cursor=, limit=)`: at most `limit` lines after `cursor` (None: the
      beginning), of `rank` only when given; see `service.joblogs` for lines, cursors and `finished`.
    - `list_artifacts(handle)` / `read_artifact(handle, path, max_bytes=)`: the files under the job's
      output folder. A backend whose folder the service cannot read raises `OutputsUnavailable`.

    Errors: `service.joblogs`'s (`BadCursor`, `ArtifactNotFound`, ...) and `base`'s three."""

    def read_logs(self, handle: Handle, *, rank: int | None, cursor: str | None, limit: int) -> LogChunk: ...

    def list_artifacts(self, handle: Handle) -> list[ArtifactInfo]: ...

    def read_artifact(self, handle: Handle, path: str, *, max_bytes: int) -> bytes: ...
