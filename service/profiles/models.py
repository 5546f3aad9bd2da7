"""The ``ProfileSummary`` record and its parts (pydantic v2).

Units: time in µs, bytes as integers, bandwidth in GB/s (1e9 B/s), percentages 0-100 of the stated
window. Every per-rank ``Partition`` is mutually exclusive and sums to its window's duration.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Bound = Literal["compute", "communication", "memory", "input", "host_launch", "idle", "balanced"]
TimelineBasis = Literal["gpu_kernels", "cpu_ops"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class HtaCompat(_Model):
    """HTA 0.5.0's ``get_temporal_breakdown`` and ``get_comm_comp_overlap`` for one rank, same semantics.

    ``applicable`` is false for traces without GPU-stream events (HTA cannot compute these there);
    ``comm_comp_overlap_pctg`` is ``None`` where HTA yields NaN (no communication kernels).
    """

    applicable: bool
    last_step_dropped: bool
    kernel_time_us: float | None = None
    idle_time_us: float | None = None
    compute_time_us: float | None = None
    non_compute_time_us: float | None = None
    idle_time_pctg: float | None = None
    compute_time_pctg: float | None = None
    non_compute_time_pctg: float | None = None
    comm_comp_overlap_pctg: float | None = None
    note: str | None = None


class Partition(_Model):
    """Exclusive split of a window: the nine ``*_us`` fields sum to ``window_us``."""

    window_us: float
    compute_only_us: float
    comm_only_us: float
    memory_only_us: float
    compute_comm_us: float
    compute_memory_us: float
    comm_memory_us: float
    compute_comm_memory_us: float
    idle_us: float
    pct: dict[str, float] = Field(description="each *_us field as % of window_us (2 decimals)")


class IdleBreakdown(_Model):
    """Exclusive split of ``Partition.idle_us`` (attributed in this order: data_loader, sync_wait,
    host_wait, kernel_wait, other). host/kernel wait exist only for GPU traces. ``waiting_on_peer_us``
    is time this rank sat in a collective, with nothing else running, until a late peer arrived: it
    is taken out of ``comm_only_us`` (it is the peer's bottleneck, not communication) and is idle."""

    data_loader_us: float
    sync_wait_us: float
    host_wait_us: float
    kernel_wait_us: float
    other_us: float
    waiting_on_peer_us: float = 0.0


class StepResult(_Model):
    step: int | None
    start_us: float
    duration_us: float
    partition: Partition


class Overlap(_Model):
    comm_overlapped_by_compute_pct: float | None = Field(
        description="|compute ∩ comm| / |comm| (HTA's definition, own-v1 classes); None without comm"
    )
    exposed_comm_us: float
    exposed_comm_pct_of_window: float
    waiting_on_peer_us: float = Field(
        description="part of each collective spent waiting for the slowest rank (duration minus the fastest "
        "rank's duration of the same collective); inside exposed/overlapped comm, not idle"
    )


class LaunchStats(_Model):
    n_launches: int
    cpu_launch_us_sum: float
    cpu_launch_us_p50: float
    cpu_launch_us_p95: float
    launch_delay_us_p50: float
    launch_delay_us_p95: float
    launch_delay_us_max: float
    short_kernels: int = Field(description="kernels shorter than their launch call")
    runtime_outliers: int = Field(description="launch calls over 50 µs")
    launch_delay_outliers: int = Field(description="launch delays over 100 µs")
    kernels_lt_10us_pct: float


class TopItem(_Model):
    """A kernel (GPU traces) or CPU op (CPU traces) aggregated by name over the analysed window."""

    name: str
    short_name: str
    category: Literal["compute", "comm", "memory", "other"]
    subcategory: str
    count: int
    total_us: float
    self_us: float | None = None
    mean_us: float
    p50_us: float
    min_us: float
    max_us: float
    std_us: float
    pct_of_window: float


class CollectiveStats(_Model):
    op: str
    dtype: str | None
    group_size: int
    count: int
    bytes: int | None = Field(description="total payload bytes, None when the trace carries no sizes")
    total_us: float
    mean_us: float
    algbw_GBps: float | None
    busbw_GBps: float | None


class RankSummary(_Model):
    rank: int
    file: str
    timeline_basis: TimelineBasis
    steps_present: list[int]
    steps_analyzed: list[int]
    step_time_us_mean: float
    window_us: float
    partition: Partition
    idle: IdleBreakdown
    overlap: Overlap
    totals_us: dict[str, float] = Field(
        description="unions per class inside the windows: compute, comm, memory"
    )
    per_step: list[StepResult]
    top_items: list[TopItem]
    collectives: list[CollectiveStats]
    launch: LaunchStats | None
    memory_bound_proxy_pct_of_compute: float = Field(
        description="share of compute time in elementwise/reduction/copy-like kernels or ops (name proxy)"
    )
    hta_compat: HtaCompat
    warnings: list[str]


class Straggler(_Model):
    rank: int
    arrived_last_pct: float
    mean_lateness_us: float
    matched_collectives: int


class CrossRank(_Model):
    step_time_us_mean: float
    step_time_us_min: float
    step_time_us_max: float
    step_time_spread_pct: float = Field(description="(max - min) / mean of per-rank mean step time")
    slowest_rank: int
    straggler: Straggler | None = Field(description="the rank that arrives last at matched collectives")
    collective_skew_us_p50: float | None
    collective_skew_us_max: float | None


class Recommendation(_Model):
    id: str
    text: str


class PlanComparison(_Model):
    predicted_comm_fraction: float
    measured_comm_fraction: float = Field(description="median over ranks of exposed communication / window")
    delta: float
    text: str


class Diagnosis(_Model):
    bound: Bound
    scores_pct: dict[str, float] = Field(description="median over ranks of each share of the window")
    confidence: Literal["high", "medium", "low"]
    evidence: list[str]
    recommendations: list[Recommendation]
    plan: PlanComparison | None


class ProfileSummary(_Model):
    schema_version: Literal["1"] = "1"
    classifier: Literal["own-v1"] = "own-v1"
    hta_compat_version: Literal["hta-0.5.0"] = "hta-0.5.0"
    backend: str | None
    world_size: int | None
    ranks_present: list[int]
    ranks: dict[str, RankSummary]
    cross_rank: CrossRank
    diagnosis: Diagnosis
