"""Pools and team quotas: what a platform admin declares (`PUT /v1/pools/{name}`,
`PUT /v1/teams/{team}/quota`, `SHARDCTL_POOLS_FILE`).

A **pool** is a set of GPUs of one kind behind one backend. A team's **quota** names, per GPU kind
(a "flavor", as Kueue calls it), how many GPUs are its own (`nominal`), how many more it may borrow
from others' unused quota (`borrowing_limit`, None: no limit but the pool) and how many of its own
unused GPUs it lends (`lending_limit`, None: all of them). Teams in the same `group` (an org) lend
to each other before lending outside it. A GPU kind a team has no entry for is quota 0 there: it
may still borrow, within `borrowing_limit` of an explicit entry with `nominal: 0`.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from service.backend_options import BackendKind
from service.names import Label


class PreemptionPolicy(StrEnum):
    """What a pool may preempt to admit a waiting job."""

    NEVER = "never"
    RECLAIM = "reclaim"  # only a team taking back its nominal quota from a borrower
    LOWER_PRIORITY = "lower_priority"  # reclaim, and within a team a higher priority preempts a lower one


class _Strict(BaseModel):
    """Unknown fields refused; numbers and flags must be JSON numbers and booleans (`true` is no GPU count)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


GpuCount = Annotated[int, Field(ge=0, le=1_000_000, strict=True)]


class Pool(_Strict):
    """GPUs of one kind behind one backend."""

    name: Label = Field(description="The pool's name (a DNS label).")
    backend: BackendKind = Field(description="The backend that runs this pool's jobs: local, slurm or kubernetes.")
    gpu: str = Field(min_length=1, max_length=64,
                     description="The GPU kind, as specs name it (e.g. H100-SXM-80GB), or cpu.")
    gpus: int = Field(ge=1, le=1_000_000, strict=True, description="How many GPUs (or cpu slots) the pool holds.")
    partition: str | None = Field(None, max_length=128, description="Slurm: the partition its jobs go to.")
    namespace: str | None = Field(None, max_length=63, description="Kubernetes: the namespace its jobs go to.")
    flavor: str | None = Field(None, max_length=63, description="Kubernetes/Kueue: the ResourceFlavor name.")
    kueue: bool = Field(False, strict=True,
                        description="Kueue admits this pool's jobs; shardctl labels them and waits.")
    preemption: PreemptionPolicy = Field(PreemptionPolicy.RECLAIM, description="What admission may preempt here.")
    cost: float | None = Field(None, gt=0, le=1000, strict=True, description="Fair-share weight of one GPU of this kind"
                               " (default: from the GPU catalog, relative to an A100's bf16 peak).")
    devices: list[str] | None = Field(None, description="Local backend: the device ids it may hand out"
                                      " (default: all it detects, or cpu slots 0..gpus-1).")


class FlavorQuota(_Strict):
    """A team's quota of one GPU kind."""

    nominal: GpuCount = Field(description="GPUs the team owns of this kind.")
    borrowing_limit: GpuCount | None = Field(None, description="More it may borrow; None: up to what is free.")
    lending_limit: GpuCount | None = Field(None, description="Of its unused nominal, how much it lends; None: all.")


class TeamQuota(_Strict):
    """A team's share of the cluster (`PUT /v1/teams/{team}/quota`)."""

    weight: float = Field(1.0, ge=0, le=1000, strict=True,
                          description="Fair-share weight (0: preempted first, served last).")
    max_priority: int = Field(100, ge=-1000, le=1000, strict=True,
                              description="The highest priority its members may set.")
    group: Label | None = Field(None, description="The org it belongs to; unused quota is lent inside it first.")
    flavors: dict[str, FlavorQuota] = Field(default_factory=dict, description="Per GPU kind.")
