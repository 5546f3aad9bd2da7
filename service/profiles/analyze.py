"""Entry point: trace files (one per rank) -> ``ProfileSummary``."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from service.profiles.collectives import Matched, RankCollectives, collect_instances, match_across_ranks
from service.profiles.diagnosis import diagnose
from service.profiles.errors import TraceError
from service.profiles.events import DEFAULT_MAX_EVENTS, RankTrace, load_rank_trace
from service.profiles.heap import release_free_heap
from service.profiles.hta_compat import hta_compat_for_rank, local_step_symbols
from service.profiles.intervals import Spans, Union, clip, intersect, measure, union
from service.profiles.models import CrossRank, HtaCompat, ProfileSummary, RankSummary, Straggler
from service.profiles.partition import add_partitions, move_to_idle
from service.profiles.rank_summary import collective_stats, launch_stats, rank_summary
from service.profiles.stats import pct, percentile
from service.profiles.timeline import Window, build_timeline


def _cross_rank(summaries: list[RankSummary], matched: Matched) -> CrossRank:
    times = {s.rank: s.step_time_us_mean for s in summaries}
    mean = statistics.fmean(times.values())
    straggler = None
    skews: list[float] = []
    if len(summaries) > 1 and len(matched):
        last: dict[int, int] = dict.fromkeys(times, 0)
        lateness: dict[int, list[float]] = {r: [] for r in times}
        for row in matched.start.tolist():
            starts = dict(zip(matched.ranks, row, strict=True))
            first = min(starts.values())
            skews.append(max(starts.values()) - first)
            last[max(starts, key=lambda r: starts[r])] += 1
            for r, s in starts.items():
                lateness[r].append(s - first)
        worst = max(last, key=lambda r: (last[r], statistics.fmean(lateness[r])))
        straggler = Straggler(
            rank=worst,
            arrived_last_pct=round(100 * last[worst] / len(matched), 2),
            mean_lateness_us=round(statistics.fmean(lateness[worst]), 3),
            matched_collectives=len(matched),
        )
    return CrossRank(
        step_time_us_mean=round(mean, 3),
        step_time_us_min=min(times.values()),
        step_time_us_max=max(times.values()),
        step_time_spread_pct=round(100 * (max(times.values()) - min(times.values())) / mean, 2) if mean else 0.0,
        slowest_rank=max(times, key=lambda r: times[r]),
        straggler=straggler,
        collective_skew_us_p50=round(percentile(skews, 50), 3) if skews else None,
        collective_skew_us_max=round(max(skews), 3) if skews else None,
    )


@dataclass
class _RankPass:
    """What is kept of one rank once its events are dropped: the summary and the cross-rank inputs."""

    path: Path
    declared_rank: int | None
    summary: RankSummary
    windows: list[Window]
    collectives: RankCollectives
    step_symbols: set[str]
    hta: dict[bool, HtaCompat]
    comm_alone: Spans  # communication with no compute or memory copy beside it, inside the windows


def _analyse_rank(trace: RankTrace, index: int, world: int | None) -> _RankPass:
    symbols = local_step_symbols(trace)
    # HTA decides whether to drop the last step from all ranks' symbols together; when this rank alone
    # cannot decide (fewer than two), both answers are kept and the right one is picked at the end.
    # Computed before the timeline exists, so that the two are never in memory together.
    choices = [True] if len(symbols) >= 2 else [False, True]
    hta = {f: hta_compat_for_rank(trace, f) for f in choices}
    tl = build_timeline(trace)
    if not tl.windows:
        raise TraceError(trace.path, "no compute, communication or step events to analyse")
    launch = launch_stats(trace, tl)  # first: its temporaries are rank-sized
    instances = collect_instances(trace, tl, world)
    collectives, in_window = RankCollectives.of(instances), collective_stats(instances, tl)
    del instances
    rank = trace.rank if trace.rank is not None else index
    summary = rank_summary(rank, trace, tl, in_window, hta[choices[0]], launch)
    in_windows = tl.comm.within(union((w.start, w.end) for w in tl.windows))
    alone = tl.memory.subtract_from(tl.compute.subtract_from(in_windows))
    return _RankPass(trace.path, trace.rank, summary, tl.windows, collectives, symbols, hta, alone)


def _with_peer_wait(p: _RankPass, total_us: float, waiting: Union, step_filter: bool) -> RankSummary:
    """The rank's summary with the time it waited on peers, where nothing else ran, moved from
    communication to idle in every step, and HTA's step decision applied."""
    alone = intersect(waiting, p.comm_alone.union())
    steps = []
    moved_total = 0.0
    for step in p.summary.per_step:
        moved = move_to_idle(step.partition, measure(clip(alone, step.start_us, step.start_us + step.duration_us)))
        moved_total += moved.idle_us - step.partition.idle_us
        steps.append(step.model_copy(update={"partition": moved}))
    partition = add_partitions([s.partition for s in steps]) if steps else p.summary.partition
    exposed = partition.comm_only_us + partition.comm_memory_us
    overlap = p.summary.overlap.model_copy(update={
        "waiting_on_peer_us": round(total_us, 3),
        "exposed_comm_us": round(exposed, 3),
        "exposed_comm_pct_of_window": pct(exposed, partition.window_us),
    })
    idle = p.summary.idle.model_copy(update={"waiting_on_peer_us": round(moved_total, 3)})
    return p.summary.model_copy(update={"per_step": steps, "partition": partition, "overlap": overlap,
                                        "idle": idle, "hta_compat": p.hta[step_filter]})


def _distributed_info(trace: RankTrace) -> tuple[int | None, str | None]:
    """(world size, backend) from the trace's ``distributedInfo``."""
    info = trace.meta.get("distributedInfo") or {}
    world = info.get("world_size") if isinstance(info.get("world_size"), int) else None
    backend = info.get("backend") if isinstance(info.get("backend"), str) else None
    return world, backend


class _RankCheck:
    """All files declare a rank, each a different one, or none does (ranks are then the argument
    order). Checked as each file is loaded, before it is analysed."""

    def __init__(self) -> None:
        self.seen: dict[int, Path] = {}
        self.undeclared: Path | None = None

    def add(self, trace: RankTrace) -> None:
        rank = trace.rank
        if rank is None:
            self.undeclared = self.undeclared or trace.path
        if self.undeclared is not None and (rank is not None or self.seen):
            raise TraceError(
                self.undeclared, "no distributedInfo.rank while other files have one; cannot tell its rank"
            )
        if rank is not None:
            if rank in self.seen:
                earlier = self.seen[rank]
                raise TraceError(trace.path, f"rank {rank} already comes from {earlier}: pass one file per rank")
            self.seen[rank] = trace.path


def analyze_traces(
    paths: Sequence[Path],
    predicted_comm_fraction: float | None = None,
    *,
    max_events: int = DEFAULT_MAX_EVENTS,
) -> ProfileSummary:
    """Analyse one Chrome/Kineto trace per rank (plain or gzip JSON, streamed).

    Ranks are analysed one after another and each rank's events are dropped before the next file is
    read, so peak memory is that of the largest single rank (bounded by ``max_events`` complete events
    per file) plus a small summary per rank. ``predicted_comm_fraction`` (0-1), when the job has a plan,
    is compared with the measured exposed communication share. Raises ``TraceError`` naming the file for
    unreadable, malformed or oversized input.
    """
    if not paths:
        raise TraceError(Path("."), "no trace files given")
    if predicted_comm_fraction is not None and not 0 <= predicted_comm_fraction <= 1:
        raise ValueError("predicted_comm_fraction must be between 0 and 1")
    passes: list[_RankPass] = []
    world: int | None = None
    backend: str | None = None
    check = _RankCheck()
    for index, path in enumerate(paths):
        trace = load_rank_trace(Path(path), max_events=max_events)
        check.add(trace)
        if index == 0:  # the first file's world size and backend apply to all
            world, backend = _distributed_info(trace)
        passes.append(_analyse_rank(trace, index, world))
        del trace
        release_free_heap()  # so that the next rank's peak is not added to this one's holes
    step_filter = len(set().union(*(p.step_symbols for p in passes))) >= 2
    matched = match_across_ranks({p.summary.rank: p.collectives for p in passes} if len(passes) > 1 else {})
    peer_wait = {p.summary.rank: 0.0 for p in passes}
    waiting: dict[int, list[tuple[float, float]]] = {r: [] for r in peer_wait}
    windows = {p.summary.rank: p.windows for p in passes}
    for starts, durs in zip(matched.start.tolist(), matched.dur.tolist(), strict=True):
        fastest = min(durs)
        for r, start, dur in zip(matched.ranks, starts, durs, strict=True):
            if dur > fastest and any(w.start <= start < w.end for w in windows[r]):
                # Clock-free: a rank that arrived early spends its extra duration, at the start of the
                # collective, waiting for the last peer (all ranks leave a collective together).
                peer_wait[r] += dur - fastest
                waiting[r].append((start, start + dur - fastest))
    summaries = [_with_peer_wait(p, peer_wait[p.summary.rank], union(waiting[p.summary.rank]), step_filter)
                 for p in passes]
    summaries.sort(key=lambda s: s.rank)
    cross = _cross_rank(summaries, matched)
    return ProfileSummary(
        backend=backend,
        world_size=world,
        ranks_present=[s.rank for s in summaries],
        ranks={str(s.rank): s for s in summaries},
        cross_rank=cross,
        diagnosis=diagnose(summaries, cross, world, predicted_comm_fraction),
    )
