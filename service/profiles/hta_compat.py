"""Reproduction of HTA 0.5.0's temporal breakdown and comm-comp overlap, with HTA's exact semantics.

What HTA does, mirrored step by step (see shared notes, section 1):

1. rows without ``dur``/``cat`` or with ``cat == "Trace"`` are dropped;
2. if any ``ts`` in the file is a float (ns-resolution traces), ``ts = ceil(ts)``, ``end = floor(ts+dur)``;
3. when the ranks together hold >= 2 distinct names containing "ProfilerStep", the last step is dropped:
   CPU rows are kept if ``ts < max(ts of ProfilerStep rows)``, GPU rows (``stream >= 0 and correlation >= 0``,
   or named Event/Context Sync) if their correlation matches a kept CPU row's;
4. kept rows with ``stream != -1`` are merged into unions per kernel type; percentages are
   ``numpy.round(100 * x / kernel_time, 2)``.

The interval merge and the overlap sweep follow HTA's pandas code literally (including its treatment of
events that rounding gave a negative duration).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from service.profiles.classify import hta_kernel_type
from service.profiles.events import RankTrace
from service.profiles.models import HtaCompat

_SYNC_NAMES = ("Event Sync", "Context Sync")


def np_round(x: float, decimals: int = 2) -> float:
    """``numpy.round``: scale, round half to even, unscale (not Python's exact decimal rounding)."""
    scale = 10.0**decimals
    return round(x * scale) / scale


def _hta_merge(rows: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """``hta.utils.utils.merge_kernel_intervals`` on (ts, end) rows."""
    rows = sorted(rows, key=lambda r: r[0])
    groups: list[list[float]] = []
    cummax = -math.inf
    for ts, end in rows:
        if not groups or ts > cummax:
            groups.append([ts, end])
        else:
            groups[-1][1] = max(groups[-1][1], end)
        cummax = max(cummax, end)
    return [(g[0], g[1]) for g in groups]


def _overlap_sweep(comm: list[tuple[float, float]], comp: list[tuple[float, float]]) -> float:
    """HTA's status sweep: total time during which the running status equals 3 (comm + comp)."""
    points = [(t, d) for s, e in comm for t, d in ((s, 1), (e, -1))]
    points += [(t, d) for s, e in comp for t, d in ((s, 2), (e, -2))]
    points.sort(key=lambda p: p[0])
    running = 0
    total = 0.0
    for k, (t, d) in enumerate(points):
        running += d
        if running == 3 and k + 1 < len(points):
            total += points[k + 1][0] - t
    return total


def _hta_rows(trace: RankTrace) -> list[tuple[float, float, int, int, str]]:
    """(ts, end, stream, correlation, name) for every row HTA keeps, with HTA's ns rounding applied."""
    rows = []
    for i in range(len(trace)):
        ts = trace.ts[i]
        end = ts + trace.dur[i]
        if trace.float_timestamps:
            ts, end = float(math.ceil(ts)), float(math.floor(end))
        rows.append((ts, end, trace.stream[i], trace.correlation[i], trace.name(i)))
    return rows


def profiler_step_symbols(traces: Sequence[RankTrace]) -> set[str]:
    symbols: set[str] = set()
    for t in traces:
        symbols.update(n for n in t.names if "ProfilerStep" in n)
        symbols.update(c for c in t.cats if "ProfilerStep" in c)
    return symbols


def hta_compat_for_rank(trace: RankTrace, step_symbols: set[str]) -> HtaCompat:
    """HTA's ``get_temporal_breakdown`` and ``get_comm_comp_overlap`` row for this rank."""
    rows = _hta_rows(trace)
    step_filter = len(step_symbols) >= 2
    if step_filter:

        def is_gpu(r: tuple[float, float, int, int, str]) -> bool:
            return (r[2] >= 0 and r[3] >= 0) or r[4] in _SYNC_NAMES

        cpu = [r for r in rows if not is_gpu(r)]
        step_starts = [r[0] for r in cpu if r[4] in step_symbols]
        last_start = max(step_starts) if step_starts else math.nan
        kept_cpu = [r for r in cpu if r[0] < last_start]
        corrs = {r[3] for r in kept_cpu}
        rows = [r for r in rows if is_gpu(r) and r[3] in corrs] + kept_cpu
    gpu = [r for r in rows if r[2] != -1]
    if not gpu:
        return HtaCompat(
            applicable=False,
            last_step_dropped=step_filter,
            note="no events with a GPU stream (CPU-only trace): HTA's breakdown is undefined here",
        )
    merged = _hta_merge([(r[0], r[1]) for r in gpu])
    kernel_time = merged[-1][1] - merged[0][0]
    run_time = sum(e for _, e in merged) - sum(s for s, _ in merged)
    idle = kernel_time - run_time
    kinds = [hta_kernel_type(r[4]) for r in gpu]
    comp = _hta_merge([(r[0], r[1]) for r, k in zip(gpu, kinds, strict=True) if k == "COMPUTATION"])
    comm = _hta_merge([(r[0], r[1]) for r, k in zip(gpu, kinds, strict=True) if k == "COMMUNICATION"])
    compute = sum(e for _, e in comp) - sum(s for s, _ in comp)
    non_compute = kernel_time - compute - idle
    comm_total = sum(e - s for s, e in comm)
    overlap_pct = np_round(100 * (_overlap_sweep(comm, comp) / comm_total), 2) if comm_total else None

    def pct(x: float) -> float | None:
        return np_round(100 * (x / kernel_time), 2) if kernel_time else None

    return HtaCompat(
        applicable=True,
        last_step_dropped=step_filter,
        kernel_time_us=kernel_time,
        idle_time_us=idle,
        compute_time_us=compute,
        non_compute_time_us=non_compute,
        idle_time_pctg=pct(idle),
        compute_time_pctg=pct(compute),
        non_compute_time_pctg=pct(non_compute),
        comm_comp_overlap_pctg=overlap_pct,
        note=None if comm_total else "no communication kernels: HTA reports NaN for the overlap",
    )
