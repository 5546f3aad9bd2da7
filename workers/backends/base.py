"""The backend protocol: one small interface that local processes, Slurm and Kubernetes implement.

The dispatcher builds a `LaunchRequest` for each attempt and only ever calls these methods:

- `render(req)`: the exact request as printable data (nothing is submitted); `submit` sends
  exactly what `render` returns, secrets filled in;
- `submit(req)`: submit it; the backend names the submission `req.name`;
- `find(name)`: the submission with that name, to adopt after a crash (None if there is none);
- `poll(handles)`: the state of many submissions in one call (one `sacct`, one labelled list);
- `cancel(handle)`: ask the backend to stop it (idempotent).

Backends raise exactly three errors, and the dispatcher catches exactly these:

- `BackendUnavailable`: the backend did not answer. "Unknown for now", never a failed job;
- `TransientBackendError`: it answered but cannot take the request now; try again later;
- `SubmissionRefused`: it answered and refused this request for good; the job fails with the reason.

Anything else is a bug: it propagates, and the job's lease makes the next cycle try again.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping, Sequence
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, Field

from service.backend_options import BackendOptions, LocalOptions
from service.jobenv import JobEnv
from service.planner.result import Plan

FailureClass = Literal["program", "capacity", "node", "preempted", "timeout", "cancelled", "lost"]
RETRYABLE: frozenset[str] = frozenset({"capacity", "node", "preempted", "lost"})


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


def attempt_name(job_id: int, attempt: int) -> str:
    return f"shardctl-{job_id}-{attempt}"


def runtime_command() -> list[str]:
    """The built-in entrypoint: the training runtime. It reads the `service.jobenv` contract.

    Commands name `python`, not this process's interpreter: a container has its own. Backends
    that run on this machine put this interpreter's directory first on PATH (`local_path_env`)."""
    return ["python", "-m", "workers.runtime"]


def local_path_env(env: dict[str, str]) -> dict[str, str]:
    """`env` with this interpreter's bin directory first on PATH, so `python` and `torchrun` are ours."""
    bindir = str(Path(sys.executable).parent)
    return {**env, "PATH": bindir + os.pathsep + env.get("PATH", os.defpath)}


SECRET_MARKERS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "API_KEY", "ACCESS_KEY", "PRIVATE_KEY")
REDACTED = "<redacted>"


def is_secret_env(key: str) -> bool:
    """Variables whose name says they hold a secret (`*TOKEN*`, `*SECRET*`, `*PASSWORD*`, `*CREDENTIAL*`,
    `*_KEY`...): never shown in a preview, and on Kubernetes and Slurm kept in their secret stores."""
    upper = key.upper()
    return upper == "KEY" or upper.endswith("_KEY") or any(marker in upper for marker in SECRET_MARKERS)


#: `scheme://user:password@host`: the password part (up to the `@`; a `/` ends the match, so a port
#: followed by a path is never taken for a password).
_URL_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s/:@]*:)(?P<password>[^\s/@]+)(?=@)")
#: Values that are credentials whatever the variable is called.
SECRET_VALUE_PATTERNS: tuple[re.Pattern[str], ...] = tuple(re.compile(p) for p in (
    r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[0-9A-Z]{16}\b",  # AWS access key ids
    r"\bgh[pousr]_[A-Za-z0-9]{20,}",  # GitHub tokens
    r"\bgithub_pat_[A-Za-z0-9_]{20,}",  # GitHub fine-grained tokens
    r"\bxox[a-z]-[A-Za-z0-9-]{8,}",  # Slack tokens
    r"\beyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*",  # JWTs (a JSON header, base64url)
    r"\bshc_[A-Za-z0-9]+_[A-Za-z0-9_-]{8,}",  # shardctl tokens
    r"\bhf_[A-Za-z0-9]{20,}",  # Hugging Face tokens
    r"\bsk-[A-Za-z0-9_-]{20,}",  # OpenAI-style secret keys
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z ]*PRIVATE KEY-----|$)",  # PEM private keys
))


def redact_value(value: str) -> str:
    """`value` with the credentials it carries replaced by `<redacted>`: the password of a URL
    (`postgresql://u:<redacted>@db/x`) and anything shaped like a known key or token (AWS, GitHub,
    Slack, JWT, shardctl...), wherever it appears in the string."""
    out = _URL_PASSWORD.sub(lambda m: m.group("head") + REDACTED, value)
    for pattern in SECRET_VALUE_PATTERNS:
        out = pattern.sub(REDACTED, out)
    return out


def is_secret_value(value: str) -> bool:
    """True when `value` carries something `redact_value` hides."""
    return redact_value(value) != value


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """Environment variables as a preview shows them: the whole value hidden when the name says it is a
    secret (`is_secret_env`), otherwise the value with its credentials hidden (`redact_value`)."""
    return {k: REDACTED if is_secret_env(k) else redact_value(v) for k, v in env.items()}


def redact_strings(data: Any) -> Any:
    """`data` (JSON-like: dicts, lists, strings) with `redact_value` applied to every string in it; for
    the parts of a preview that are not an environment (command lines, rendered scripts)."""
    if isinstance(data, str):
        return redact_value(data)
    if isinstance(data, Mapping):
        return {k: redact_strings(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [redact_strings(v) for v in data]
    return data


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

    def render(self, req: LaunchRequest) -> Rendered: ...

    def submit(self, req: LaunchRequest) -> Handle: ...

    def find(self, name: str) -> Handle | None: ...

    def poll(self, handles: Sequence[Handle]) -> dict[str, Observation]: ...

    def cancel(self, handle: Handle) -> None: ...
