"""Entry point: trace files (one per rank) -> ``ProfileSummary``."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path

from service.profiles.collectives import collect_instances, match_across_ranks
from service.profiles.diagnosis import diagnose
from service.profiles.errors import TraceError
from service.profiles.events import RankTrace, load_rank_trace
from service.profiles.hta_compat import hta_compat_for_rank, profiler_step_symbols
from service.profiles.models import CrossRank, ProfileSummary, RankSummary, Straggler
from service.profiles.rank_summary import rank_summary
from service.profiles.stats import percentile
from service.profiles.timeline import build_timeline


def _assign_ranks(traces: list[RankTrace]) -> list[int]:
    ranks = [t.rank for t in traces]
    if all(r is None for r in ranks):
        return list(range(len(traces)))
    seen: dict[int, Path] = {}
    for t, r in zip(traces, ranks, strict=True):
        if r is None:
            raise TraceError(
                t.path, "no distributedInfo.rank while other files have one; cannot tell its rank"
            )
        if r in seen:
            raise TraceError(t.path, f"rank {r} already comes from {seen[r]}: pass one file per rank")
        seen[r] = t.path
    return [r for r in ranks if r is not None]


def _cross_rank(summaries: list[RankSummary], matched: list[dict[int, object]]) -> CrossRank:
    times = {s.rank: s.step_time_us_mean for s in summaries}
    mean = statistics.fmean(times.values())
    straggler = None
    skews: list[float] = []
    if len(summaries) > 1 and matched:
        last: dict[int, int] = dict.fromkeys(times, 0)
        lateness: dict[int, list[float]] = {r: [] for r in times}
        for m in matched:
            starts = {r: c.start for r, c in m.items()}  # type: ignore[attr-defined]
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
        step_time_spread_pct=round(100 * (max(times.values()) - min(times.values())) / mean, 2)
        if mean
        else 0.0,
        slowest_rank=max(times, key=lambda r: times[r]),
        straggler=straggler,
        collective_skew_us_p50=round(percentile(skews, 50), 3) if skews else None,
        collective_skew_us_max=round(max(skews), 3) if skews else None,
    )


def analyze_traces(paths: Sequence[Path], predicted_comm_fraction: float | None = None) -> ProfileSummary:
    """Analyse one Chrome/Kineto trace per rank (plain or gzip JSON, streamed).

    ``predicted_comm_fraction`` (0-1), when the job has a plan, is compared with the measured exposed
    communication share. Raises ``TraceError`` naming the file for unreadable or malformed input.
    """
    if not paths:
        raise TraceError(Path("."), "no trace files given")
    if predicted_comm_fraction is not None and not 0 <= predicted_comm_fraction <= 1:
        raise ValueError("predicted_comm_fraction must be between 0 and 1")
    traces = [load_rank_trace(Path(p)) for p in paths]
    ranks = _assign_ranks(traces)
    info = traces[0].meta.get("distributedInfo") or {}
    world = info.get("world_size") if isinstance(info.get("world_size"), int) else None
    backend = info.get("backend") if isinstance(info.get("backend"), str) else None
    step_symbols = profiler_step_symbols(traces)
    timelines = [build_timeline(t) for t in traces]
    for t, tl in zip(traces, timelines, strict=True):
        if not tl.windows:
            raise TraceError(t.path, "no compute, communication or step events to analyse")
    instances = {
        r: collect_instances(t, tl, world) for r, t, tl in zip(ranks, traces, timelines, strict=True)
    }
    matched = match_across_ranks(instances) if len(traces) > 1 else []
    peer_wait = dict.fromkeys(ranks, 0.0)
    for m in matched:
        fastest = min(c.dur for c in m.values())
        for r, c in m.items():
            if any(w.start <= c.start < w.end for w in timelines[ranks.index(r)].windows):
                peer_wait[r] += c.dur - fastest
    summaries = [
        rank_summary(r, t, tl, instances[r], peer_wait[r], hta_compat_for_rank(t, step_symbols))
        for r, t, tl in zip(ranks, traces, timelines, strict=True)
    ]
    summaries.sort(key=lambda s: s.rank)
    cross = _cross_rank(summaries, matched)  # type: ignore[arg-type]
    return ProfileSummary(
        backend=backend,
        world_size=world,
        ranks_present=[s.rank for s in summaries],
        ranks={str(s.rank): s for s in summaries},
        cross_rank=cross,
        diagnosis=diagnose(summaries, cross, world, predicted_comm_fraction),
    )
