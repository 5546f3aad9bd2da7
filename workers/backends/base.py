"""The backend protocol: one small interface that local processes, Slurm and Kubernetes implement.

The dispatcher builds a `LaunchRequest` for each attempt and only ever calls these methods:

- `render(req)`: the exact request as printable data (nothing is submitted);
- `submit(req)`: submit it; the backend names the submission `req.name`;
- `find(name)`: the submission with that name, to adopt after a crash (None if there is none);
- `poll(handles)`: the state of many submissions in one call (one `sacct`, one labelled list);
- `cancel(handle)`: ask the backend to stop it (idempotent);
- `logs(handle, rank, follow)`: a rank's output.

A backend that cannot be reached raises `BackendUnavailable`: the dispatcher treats that as
"unknown for now", never as a failed job.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, Field

FailureClass = Literal["program", "capacity", "node", "preempted", "timeout", "cancelled", "lost"]
RETRYABLE: frozenset[str] = frozenset({"capacity", "node", "preempted", "lost"})


class BackendUnavailable(RuntimeError):
    """The backend did not answer (network, controller down). Not a verdict on any job."""


class Capabilities(BaseModel):
    multi_node: bool
    gpus: bool
    logs: bool
    preemption_requeue: bool


class LaunchRequest(BaseModel):
    """Everything a backend needs to start one attempt of a job on every node."""

    job_id: int
    attempt: int
    name: str = Field(description="Deterministic attempt name: shardctl-<job id>-<attempt>.")
    nodes: int
    procs_per_node: int
    gpus_per_proc: int = Field(description="0 on the cpu kind.")
    command: list[str] = Field(description="The entrypoint each process runs (torchrun starts it).")
    env: dict[str, str] = Field(default_factory=dict, description="Job token, API URL, NCCL settings...")
    image: str | None = None
    plan: dict[str, Any] = Field(description="The Plan JSON; backends ship it as a file or env var.")
    spec: dict[str, Any] = Field(description="The TrainingSpec JSON (backend options live in spec.backend).")
    team: str

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    @property
    def backend_options(self) -> dict[str, Any]:
        options: dict[str, Any] = self.spec.get("backend", {})
        return options


def attempt_name(job_id: int, attempt: int) -> str:
    return f"shardctl-{job_id}-{attempt}"


PLAN_ENV = "SHARDCTL_PLAN_JSON"
SPEC_ENV = "SHARDCTL_SPEC_JSON"
OUT_ENV = "SHARDCTL_OUT_DIR"


def runtime_command() -> list[str]:
    """The built-in entrypoint: the training runtime. It reads the plan from $SHARDCTL_PLAN_JSON
    (every backend ships `LaunchRequest.env`, which carries it) and writes to $SHARDCTL_OUT_DIR.

    Commands name `python`, not this process's interpreter: a container has its own. Backends
    that run on this machine put this interpreter's directory first on PATH (`local_path_env`)."""
    return ["python", "-m", "workers.runtime"]


def local_path_env(env: dict[str, str]) -> dict[str, str]:
    """`env` with this interpreter's bin directory first on PATH, so `python` and `torchrun` are ours."""
    bindir = str(Path(sys.executable).parent)
    return {**env, "PATH": bindir + os.pathsep + env.get("PATH", os.defpath)}


SECRET_MARKERS = ("TOKEN", "SECRET", "PASSWORD", "CREDENTIAL")
REDACTED = "<redacted>"


def is_secret_env(key: str) -> bool:
    """Variables that hold secrets: never shown in a preview, and on Kubernetes kept in a Secret."""
    upper = key.upper()
    return any(marker in upper for marker in SECRET_MARKERS)


def torchrun_command(req: LaunchRequest, *, rdzv_endpoint: str, node_rank: str | None = None) -> list[str]:
    """`torchrun` for one node of the job: the plan's world, c10d rendezvous on the first node.

    `--no-python`: the entrypoint is a whole command line (`python -m ...`, a binary), not a script."""
    args = ["python", "-m", "torch.distributed.run", "--no-python", f"--nnodes={req.nodes}",
            f"--nproc-per-node={req.procs_per_node}", "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}",
            f"--rdzv-id={req.name}", "--max-restarts=0"]
    if node_rank is not None:
        args.append(f"--node-rank={node_rank}")
    return [*args, *req.command]


class Handle(BaseModel):
    """A submission the backend knows: its name and the backend's own id for it."""

    name: str
    backend_id: str | None = None


class RunState(StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    MISSING = "MISSING"  # the backend does not know this name (never submitted, or long gone)


class Observation(BaseModel):
    """What the backend says about one submission."""

    state: RunState
    nodes: list[str] = Field(default_factory=list)
    exit_code: int | None = None
    failure: FailureClass | None = None
    reason: str | None = None
    log_tail: str | None = None
    requeues: int = Field(0, description="Times the backend requeued this same submission (preemption).")
    requeue_reasons: list[str] = Field(default_factory=list)


class Rendered(BaseModel):
    """The exact request a backend would send, as data: printable, comparable in golden files."""

    backend: str
    name: str
    content: dict[str, Any]


@runtime_checkable
class Backend(Protocol):
    name: str
    capabilities: Capabilities

    def render(self, req: LaunchRequest) -> Rendered: ...

    def submit(self, req: LaunchRequest) -> Handle: ...

    def find(self, name: str) -> Handle | None: ...

    def poll(self, handles: Sequence[Handle]) -> dict[str, Observation]: ...

    def cancel(self, handle: Handle) -> None: ...

    def logs(self, handle: Handle, rank: int = 0, follow: bool = False) -> Iterator[str]: ...
