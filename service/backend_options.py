"""Where a job runs: one options model per backend, a discriminated union on `kind`.

Everything a backend reads from a spec is checked here, at submit, so a bad sbatch flag or
toleration is a 422 naming the field, never a job that fails at dispatch. A spec without
`backend.kind` means `local`.
"""

from __future__ import annotations

import math
import re
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator

from service.names import Label


class BackendKind(StrEnum):
    LOCAL = "local"
    SLURM = "slurm"
    KUBERNETES = "kubernetes"


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LocalOptions(_Options):
    """The embedded default: torchrun process groups on the API's own machine."""

    kind: Literal[BackendKind.LOCAL] = BackendKind.LOCAL
    time_limit: str | None = Field(None, max_length=32, description="Longest an attempt may run, e.g. 02:00:00 or"
                                   " 00:00:30 ([D-]HH:MM[:SS]); the local supervisor then stops it (SIGTERM, then"
                                   " SIGKILL) and the attempt ends as `timeout`, not retried.")

    @field_validator("time_limit")
    @classmethod
    def _time(cls, value: str | None) -> str | None:
        if value is not None:
            time_limit_seconds(value)
        return value


_TIME_LIMIT = re.compile(r"^(?:(\d+)-)?(\d{1,2}):(\d{2})(?::(\d{2}))?$")
_SBATCH_FLAG = re.compile(r"^--([a-z][a-z0-9-]*)(?:=(.*))?$", re.DOTALL)
#: the longest Slurm time limit a spec may ask for (a day count of 309 digits overflowed the
#: conversion to minutes: a 500)
MAX_TIME_LIMIT_DAYS = 365
#: the longest a Kubernetes toleration may outlast its taint: ten years (omit it to tolerate forever)
MAX_TOLERATION_SECONDS = 10 * 365 * 24 * 3600
#: sbatch flags the Slurm backend sets itself: a spec may not override them (it has fields for them)
RESERVED_SBATCH_FLAGS = frozenset({"job-name", "nodes", "ntasks-per-node", "ntasks", "time", "output", "error",
                                   "signal", "open-mode", "partition", "account", "qos", "array", "wrap", "chdir"})


def time_limit_minutes(value: str) -> int:
    """`[D-]HH:MM[:SS]` -> whole minutes, rounded up (submitit takes `time` in minutes)."""
    match = _TIME_LIMIT.match(value)
    if not match:
        raise ValueError(f"bad Slurm time limit {value!r}: use HH:MM[:SS] or D-HH:MM[:SS], e.g. 02:00:00")
    if match.group(1) and (len(match.group(1)) > 3 or int(match.group(1)) > MAX_TIME_LIMIT_DAYS):
        raise ValueError(f"Slurm time limit {value[:20]!r}: at most {MAX_TIME_LIMIT_DAYS} days (0-00:00 to"
                         f" {MAX_TIME_LIMIT_DAYS}-00:00:00)")
    days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
    return max(1, math.ceil(((days * 24 + hours) * 60 + minutes) + seconds / 60))


def time_limit_seconds(value: str) -> int:
    """`[D-]HH:MM[:SS]` -> seconds, at least 1 (the local backend's limit, to the second)."""
    match = _TIME_LIMIT.match(value)
    if not match or (match.group(1) and (len(match.group(1)) > 3 or int(match.group(1)) > MAX_TIME_LIMIT_DAYS)):
        raise ValueError(f"bad time limit {value[:20]!r}: use HH:MM[:SS] or D-HH:MM[:SS] (at most"
                         f" {MAX_TIME_LIMIT_DAYS} days), e.g. 02:00:00")
    days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
    total = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    if total < 1:
        raise ValueError(f"time limit {value!r}: at least one second, e.g. 00:00:30")
    return total


def sbatch_flag(flag: str) -> tuple[str, str | None]:
    """`--name[=value]` -> (name, value); `ValueError` naming the fix for anything else."""
    match = _SBATCH_FLAG.match(flag)
    if not match:
        raise ValueError(f"sbatch flag {flag!r}: use the long form --name or --name=value")
    return match.group(1), match.group(2)


class SlurmOptions(_Options):
    """Slurm through submitit: one torchrun agent per node."""

    kind: Literal[BackendKind.SLURM]
    partition: str | None = Field(None, min_length=1, max_length=200)
    account: str | None = Field(None, min_length=1, max_length=200)
    qos: str | None = Field(None, min_length=1, max_length=200)
    time_limit: str | None = Field(None, max_length=32, description="Slurm time limit, e.g. 02:00:00 or 1-12:00:00;"
                                   f" at most {MAX_TIME_LIMIT_DAYS} days.")
    sbatch: list[str] = Field(default_factory=list, max_length=64,
                              description="Extra long sbatch flags, e.g. --exclusive or --constraint=a100.")

    @field_validator("time_limit")
    @classmethod
    def _time(cls, value: str | None) -> str | None:
        if value is not None:
            time_limit_minutes(value)
        return value

    @field_validator("sbatch")
    @classmethod
    def _flags(cls, flags: list[str]) -> list[str]:
        for flag in flags:
            name, _ = sbatch_flag(flag)
            if name in RESERVED_SBATCH_FLAGS:
                raise ValueError(f"sbatch flag {flag!r}: shardctl sets --{name} itself (use the spec's "
                                 "resources.nodes or backend.partition, account, qos or time_limit)")
        return flags


class Toleration(_Options):
    """A Kubernetes pod toleration (the fields of core/v1 Toleration)."""

    key: str | None = Field(None, max_length=316)
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = Field(None, max_length=63)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    tolerationSeconds: int | None = Field(None, ge=0, le=MAX_TOLERATION_SECONDS,
                                          description=f"0 to {MAX_TOLERATION_SECONDS:,} (ten years).")

    def as_k8s(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class KubernetesOptions(_Options):
    """Kubernetes: a JobSet (default), an Indexed Job with a headless Service, or a PyTorchJob."""

    kind: Literal[BackendKind.KUBERNETES]
    namespace: Label | None = Field(None, description="Namespace of the job's objects (default: the backend's).")
    object: Literal["jobset", "indexed-job", "pytorchjob"] | None = Field(
        None, description="The object that runs the job; default: JobSet when the cluster serves it.")
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list, max_length=64)


def _kind_of(value: Any) -> str:
    if isinstance(value, dict):
        return str(value.get("kind", BackendKind.LOCAL.value))
    return str(getattr(value, "kind", BackendKind.LOCAL.value))


BackendOptions = Annotated[
    Annotated[LocalOptions, Tag("local")] | Annotated[SlurmOptions, Tag("slurm")]
    | Annotated[KubernetesOptions, Tag("kubernetes")],
    Discriminator(_kind_of, custom_error_type="backend_kind",
                  custom_error_message="backend.kind must be one of local, slurm, kubernetes"),
]
