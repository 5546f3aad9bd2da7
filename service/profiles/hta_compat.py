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
from operator import itemgetter

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
    if not rows:
        return []
    rows = sorted(rows, key=itemgetter(0))
    out: list[tuple[float, float]] = []
    start, end_max = rows[0]
    cummax = end_max
    for ts, end in rows[1:]:
        if ts > cummax:
            out.append((start, end_max))
            start, end_max = ts, end
        elif end > end_max:
            end_max = end
        if end > cummax:
            cummax = end
    out.append((start, end_max))
    return out


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


def local_step_symbols(trace: RankTrace) -> set[str]:
    """The names and categories in this rank that contain "ProfilerStep" (HTA's step symbols)."""
    return {n for n in trace.names if "ProfilerStep" in n} | {c for c in trace.cats if "ProfilerStep" in c}


def hta_compat_for_rank(trace: RankTrace, step_filter: bool) -> HtaCompat:
    """HTA's ``get_temporal_breakdown`` and ``get_comm_comp_overlap`` row for this rank.

    ``step_filter`` is HTA's decision, taken over all ranks together: at least two distinct step symbols
    (see ``local_step_symbols``) exist, so the last profiled step is dropped. Works on event indices so
    that no per-event row objects are built.
    """
    ts_col, dur_col, stream, corr, name_idx = trace.ts, trace.dur, trace.stream, trace.correlation, trace.name_idx
    if trace.float_timestamps:
        starts = [float(math.ceil(ts)) for ts in ts_col]
        ends = [float(math.floor(ts + d)) for ts, d in zip(ts_col, dur_col, strict=True)]
    else:
        starts = list(ts_col)
        ends = [ts + d for ts, d in zip(ts_col, dur_col, strict=True)]
    on_stream = [i for i, s in enumerate(stream) if s != -1]
    if step_filter:
        symbols = local_step_symbols(trace)
        sync_name = [name in _SYNC_NAMES for name in trace.names]
        step_name = [name in symbols for name in trace.names]
        is_gpu = [
            (s >= 0 and c >= 0) or sync_name[k] for s, c, k in zip(stream, corr, name_idx, strict=True)
        ]
        step_starts = [starts[i] for i, k in enumerate(name_idx) if step_name[k] and not is_gpu[i]]
        last_start = max(step_starts) if step_starts else math.nan
        kept_corrs = {c for c, g, st in zip(corr, is_gpu, starts, strict=True) if not g and st < last_start}
        on_stream = [i for i in on_stream if (corr[i] in kept_corrs if is_gpu[i] else starts[i] < last_start)]

    kinds = [hta_kernel_type(name) for name in trace.names]
    rows = [(starts[i], ends[i]) for i in on_stream]
    comp_rows = [(starts[i], ends[i]) for i in on_stream if kinds[name_idx[i]] == "COMPUTATION"]
    comm_rows = [(starts[i], ends[i]) for i in on_stream if kinds[name_idx[i]] == "COMMUNICATION"]
    del starts, ends
    if not rows:
        return HtaCompat(
            applicable=False,
            last_step_dropped=step_filter,
            note="no events with a GPU stream (CPU-only trace): HTA's breakdown is undefined here",
        )
    merged = _hta_merge(rows)
    del rows
    kernel_time = merged[-1][1] - merged[0][0]
    # HTA sums starts and ends separately, after shifting time so that the earliest event is at 0,
    # which keeps its sums exact. Summed unshifted (trace timestamps are ~1e12-1e15 us), float sums
    # lose whole microseconds past 2**53; summing each interval's length gives HTA's exact result.
    run_time = sum(e - s for s, e in merged)
    idle = kernel_time - run_time
    comp = _hta_merge(comp_rows)
    comm = _hta_merge(comm_rows)
    compute = sum(e - s for s, e in comp)
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
