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

import numpy as np
import numpy.typing as npt

from service.profiles.classify import hta_kernel_type
from service.profiles.events import RankTrace, column
from service.profiles.models import HtaCompat
from service.profiles.stats import stable_sorted, sum_in_order

_SYNC_NAMES = ("Event Sync", "Context Sync")


def np_round(x: float, decimals: int = 2) -> float:
    """``numpy.round``: scale, round half to even, unscale (not Python's exact decimal rounding)."""
    scale = 10.0**decimals
    return round(x * scale) / scale


FloatArray = npt.NDArray[np.float64]


def _hta_merge(starts: FloatArray, ends: FloatArray) -> tuple[FloatArray, FloatArray]:
    """``hta.utils.utils.merge_kernel_intervals`` on rows in file order: a stable sort by start; a row
    opens a new interval when it starts after every earlier row's end."""
    if len(starts) == 0:
        return starts, ends
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    opens = np.empty(len(s), dtype=bool)
    opens[0] = True
    np.greater(s[1:], np.maximum.accumulate(e)[:-1], out=opens[1:])
    first = np.flatnonzero(opens)
    return s[first], np.maximum.reduceat(e, first)


def _overlap_sweep(comm: tuple[FloatArray, FloatArray], comp: tuple[FloatArray, FloatArray]) -> float:
    """HTA's status sweep: total time during which the running status equals 3 (comm + comp)."""
    n_comm, n_comp = 2 * len(comm[0]), 2 * len(comp[0])
    times = np.empty(n_comm + n_comp)
    steps = np.empty(n_comm + n_comp, dtype=np.int64)
    times[0:n_comm:2], times[1:n_comm:2] = comm
    times[n_comm::2], times[n_comm + 1 :: 2] = comp
    steps[0:n_comm:2], steps[1:n_comm:2], steps[n_comm::2], steps[n_comm + 1 :: 2] = 1, -1, 2, -2
    order = np.argsort(times, kind="stable")
    times = times[order]
    both = np.cumsum(steps[order])[:-1] == 3
    return sum_in_order(times[1:][both] - times[:-1][both])


def local_step_symbols(trace: RankTrace) -> set[str]:
    """The names and categories in this rank that contain "ProfilerStep" (HTA's step symbols)."""
    return {n for n in trace.names if "ProfilerStep" in n} | {c for c in trace.cats if "ProfilerStep" in c}


def hta_compat_for_rank(trace: RankTrace, step_filter: bool) -> HtaCompat:
    """HTA's ``get_temporal_breakdown`` and ``get_comm_comp_overlap`` row for this rank.

    ``step_filter`` is HTA's decision, taken over all ranks together: at least two distinct step symbols
    (see ``local_step_symbols``) exist, so the last profiled step is dropped. Works on event indices so
    that no per-event row objects are built.
    """
    ts = column(trace.ts)
    dur = column(trace.dur)
    stream = column(trace.stream)
    corr = column(trace.correlation)
    name_idx = column(trace.name_idx)
    if trace.float_timestamps:
        starts, ends = np.ceil(ts), np.floor(ts + dur)
    else:
        starts, ends = ts, ts + dur
    keep = stream != -1
    if step_filter:
        symbols = local_step_symbols(trace)
        sync_name = np.array([name in _SYNC_NAMES for name in trace.names])
        step_name = np.array([name in symbols for name in trace.names])
        is_gpu = ((stream >= 0) & (corr >= 0)) | sync_name[name_idx]
        step_starts = starts[step_name[name_idx] & ~is_gpu]
        last_start = float(step_starts.max()) if len(step_starts) else math.nan
        before_last = starts < last_start
        # np.isin(corr, kept CPU rows' correlations), by bisection: isin sorts a copy of both sides
        kept_corrs = stable_sorted(corr[~is_gpu & before_last])
        if len(kept_corrs):
            at = np.searchsorted(kept_corrs, corr)
            np.minimum(at, len(kept_corrs) - 1, out=at)
            matched = kept_corrs[at] == corr
            del at
        else:
            matched = np.zeros(len(corr), dtype=bool)
        keep &= np.where(is_gpu, matched, before_last)
        del kept_corrs, matched, is_gpu, before_last
    kinds = np.array([hta_kernel_type(name) for name in trace.names])
    comp_rows = keep & (kinds == "COMPUTATION")[name_idx]  # by name first: kinds[name_idx] is ~50 B an event
    comm_rows = keep & (kinds == "COMMUNICATION")[name_idx]
    if not keep.any():
        return HtaCompat(
            applicable=False,
            last_step_dropped=step_filter,
            note="no events with a GPU stream (CPU-only trace): HTA's breakdown is undefined here",
        )
    merged_starts, merged_ends = _hta_merge(starts[keep], ends[keep])
    kernel_time = float(merged_ends[-1] - merged_starts[0])
    # HTA sums starts and ends separately, after shifting time so that the earliest event is at 0,
    # which keeps its sums exact. Summed unshifted (trace timestamps are ~1e12-1e15 us), float sums
    # lose whole microseconds past 2**53; summing each interval's length gives HTA's exact result.
    run_time = sum_in_order(merged_ends - merged_starts)
    del merged_starts, merged_ends, keep
    idle = kernel_time - run_time
    comp = _hta_merge(starts[comp_rows], ends[comp_rows])
    comm = _hta_merge(starts[comm_rows], ends[comm_rows])
    del starts, ends, comp_rows, comm_rows
    compute = sum_in_order(comp[1] - comp[0])
    non_compute = kernel_time - compute - idle
    comm_total = sum_in_order(comm[1] - comm[0])
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
