"""Everything about one rank: partition, idle split, overlap, top kernels/ops, launches, collectives."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import numpy.typing as npt

from service.profiles.classify import LAUNCH_RUNTIME, MEMORY_BOUND_PROXY, EventClass, short_name, subcategory
from service.profiles.collectives import Instance, summarize
from service.profiles.events import RankTrace, column
from service.profiles.intervals import Membership, union
from service.profiles.models import CollectiveStats, HtaCompat, LaunchStats, Overlap, RankSummary, StepResult, TopItem
from service.profiles.partition import add_idle, add_partitions, idle_breakdown, partition_window
from service.profiles.stats import pct, percentile, percentile_of_array, std, sum_in_order
from service.profiles.timeline import CLASSES, Timeline, Window

TOP_N = 10


def _in_windows(windows: list[Window]) -> Membership:
    """Which times fall inside one of the step windows."""
    return Membership((w.start, w.end) for w in windows)


def _self_times(t: RankTrace, items: list[int]) -> dict[int, float]:
    """Self time of nested CPU ops per thread (inclusive time minus direct children)."""
    self_t = {i: t.dur[i] for i in items}
    by_thread: dict[int, list[int]] = defaultdict(list)
    for i in items:
        by_thread[t.thread_idx[i]].append(i)
    for evs in by_thread.values():
        evs.sort(key=lambda i: (t.ts[i], -t.dur[i]))
        stack: list[int] = []
        for i in evs:
            while stack and t.ts[stack[-1]] + t.dur[stack[-1]] <= t.ts[i]:
                stack.pop()
            if stack:
                self_t[stack[-1]] -= t.dur[i]
            stack.append(i)
    return self_t


def _top_items(
    t: RankTrace, tl: Timeline, windows: list[Window], window_us: float
) -> tuple[list[TopItem], float]:
    ts = column(t.ts)
    inside = _in_windows(windows).contains(ts[tl.item_events])
    items, item_class = tl.item_events[inside], tl.item_class[inside]
    self_t = _self_times(t, items.tolist()) if tl.basis == "cpu_ops" else {}
    # groups by name, in the order of each name's first item
    names = column(t.name_idx)[items]
    by_name = np.argsort(names, kind="stable")
    ranked = names[by_name]
    bounds = np.flatnonzero(ranked[1:] != ranked[:-1]) + 1  # not np.diff: int32 subtraction is its own code
    del ranked
    groups = sorted(np.split(by_name, bounds) if len(items) else [], key=lambda g: int(g[0]))
    dur = column(t.dur)

    def stats(group: npt.NDArray[np.intp]) -> tuple[list[float], list[float] | None]:
        members = items[group]
        return dur[members].tolist(), [self_t[i] for i in members.tolist()] if self_t else None

    # Every name counts towards the proxy and is ranked; only the TOP_N kept become rows, the other
    # (hundreds, on real traces) skip their percentiles, short names and models.
    keys: list[float] = []
    proxy = compute_total = 0.0
    for group in groups:
        durs, selfs = stats(group)
        weight = sum(selfs) if selfs is not None else sum(durs)
        cls = CLASSES[item_class[group[0]]]
        if cls is EventClass.compute:
            compute_total += weight
            if subcategory(t.names[names[group[0]]], cls) in MEMORY_BOUND_PROXY:
                proxy += weight
        keys.append(round(weight, 3))  # a row's self_us, or its total_us without self times
    rows: list[TopItem] = []
    for k in sorted(range(len(groups)), key=lambda k: -keys[k])[:TOP_N]:  # stable: ties stay in group order
        group = groups[k]
        name, cls = t.names[names[group[0]]], CLASSES[item_class[group[0]]]
        durs, selfs = stats(group)
        weight = sum(selfs) if selfs is not None else sum(durs)
        rows.append(
            TopItem(
                name=name,
                short_name=short_name(name),
                category=cls.value,
                subcategory=subcategory(name, cls),
                count=len(durs),
                total_us=round(sum(durs), 3),
                self_us=None if selfs is None else round(sum(selfs), 3),
                mean_us=round(sum(durs) / len(durs), 3),
                p50_us=round(percentile(durs, 50), 3),
                min_us=round(min(durs), 3),
                max_us=round(max(durs), 3),
                std_us=round(std(durs), 3),
                pct_of_window=pct(weight, window_us),
            )
        )
    return rows, pct(proxy, compute_total)


def launch_stats(t: RankTrace, tl: Timeline) -> LaunchStats | None:
    """Kernel launch figures inside the step windows (GPU timelines only). The rank's analysis calls
    it before anything else of the rank's summary exists, since its temporaries are rank-sized."""
    windows = tl.windows
    if tl.basis != "gpu_kernels":
        return None
    # each correlation id's first CPU-side launch call (cudaLaunchKernel...); rank-sized temporaries
    # are made in place and dropped once used, since this runs at the rank's memory peak
    stream = column(t.stream)
    corr_ids = column(t.correlation)
    is_launch = np.array([n in LAUNCH_RUNTIME for n in t.names], dtype=bool)
    mask = is_launch[column(t.name_idx)]
    mask &= stream < 0
    mask &= corr_ids >= 0
    calls = np.flatnonzero(mask).astype(np.int32)
    del mask
    call_corrs = corr_ids[calls]
    order = np.argsort(call_corrs, kind="stable")  # np.unique(..., return_index=True)
    call_corrs, calls = call_corrs[order], calls[order]
    del order
    firsts = np.flatnonzero(np.concatenate(([len(call_corrs) > 0], call_corrs[1:] != call_corrs[:-1])))
    call_corrs, call_at = call_corrs[firsts], calls[firsts]
    del calls, firsts
    ts, dur = column(t.ts), column(t.dur)
    gpu = tl.item_events[tl.item_class != CLASSES.index(EventClass.other)]
    items = gpu[_in_windows(windows).contains(ts[gpu])]
    del gpu
    n_gpu, lt10 = len(items), int(np.count_nonzero(dur[items] < 10))
    if len(call_corrs) and n_gpu:
        item_corrs = corr_ids[items]
        pos = np.searchsorted(call_corrs, item_corrs)
        np.minimum(pos, len(call_corrs) - 1, out=pos)
        found = call_corrs[pos] == item_corrs
        del item_corrs
        g, r = items[found], call_at[pos[found]]
        del pos, found
    else:
        g = r = np.zeros(0, dtype=np.intp)
    del items, call_corrs, call_at
    cpu_d = dur[r]
    delays = ts[g] - (ts[r] + cpu_d)
    np.maximum(0.0, delays, out=delays)
    short = int(np.count_nonzero(dur[g] < cpu_d))
    del g, r
    if np.isnan(cpu_d).any() or np.isnan(delays).any():  # sorted() and max() order NaN as they meet it
        return _launch_stats_of_lists(cpu_d.tolist(), delays.tolist(), short, lt10, n_gpu)
    return LaunchStats(
        n_launches=len(cpu_d),
        cpu_launch_us_sum=round(sum_in_order(cpu_d), 3),
        cpu_launch_us_p50=round(percentile_of_array(cpu_d, 50), 3),
        cpu_launch_us_p95=round(percentile_of_array(cpu_d, 95), 3),
        launch_delay_us_p50=round(percentile_of_array(delays, 50), 3),
        launch_delay_us_p95=round(percentile_of_array(delays, 95), 3),
        launch_delay_us_max=round(float(delays.max()) if len(delays) else 0.0, 3),
        short_kernels=short,
        runtime_outliers=int(np.count_nonzero(cpu_d > 50)),
        launch_delay_outliers=int(np.count_nonzero(delays > 100)),
        kernels_lt_10us_pct=pct(lt10, n_gpu),
    )


def _launch_stats_of_lists(cpu_d: list[float], delays: list[float], short: int, lt10: int, n_gpu: int) -> LaunchStats:
    return LaunchStats(
        n_launches=len(cpu_d),
        cpu_launch_us_sum=round(sum(cpu_d), 3),
        cpu_launch_us_p50=round(percentile(cpu_d, 50), 3),
        cpu_launch_us_p95=round(percentile(cpu_d, 95), 3),
        launch_delay_us_p50=round(percentile(delays, 50), 3),
        launch_delay_us_p95=round(percentile(delays, 95), 3),
        launch_delay_us_max=round(max(delays, default=0.0), 3),
        short_kernels=short,
        runtime_outliers=sum(d > 50 for d in cpu_d),
        launch_delay_outliers=sum(d > 100 for d in delays),
        kernels_lt_10us_pct=pct(lt10, n_gpu),
    )


def collective_stats(instances: list[Instance], tl: Timeline) -> list[CollectiveStats]:
    """The rank's collectives that start inside a step window, summarised."""
    inside = _in_windows(tl.windows)
    return summarize([c for c in instances if c.start in inside])


def rank_summary(
    rank: int,
    t: RankTrace,
    tl: Timeline,
    collectives: list[CollectiveStats],
    hta: HtaCompat,
    launch: LaunchStats | None,
) -> RankSummary:
    """The rank's summary; ``collectives`` is ``collective_stats(...)`` and ``launch`` is
    ``launch_stats(t, tl)``, both computed first so that their inputs are gone by the rank's peak."""
    windows = tl.windows
    per_step: list[StepResult] = []
    idles = []
    for w in windows:
        part, idle = partition_window(tl, w.start, w.end)
        per_step.append(
            StepResult(step=w.step, start_us=w.start, duration_us=round(w.end - w.start, 3), partition=part)
        )
        idles.append(idle_breakdown(tl, idle))
    partition = add_partitions([s.partition for s in per_step])
    window_us = partition.window_us
    win_u = union((w.start, w.end) for w in windows)
    comp, comm, mem = tl.compute.within(win_u), tl.comm.within(win_u), tl.memory.within(win_u)
    comm_us = comm.measure()
    exposed = partition.comm_only_us + partition.comm_memory_us
    overlap = Overlap(
        comm_overlapped_by_compute_pct=pct(comp.within(comm).measure(), comm_us) if comm_us else None,
        exposed_comm_us=round(exposed, 3),
        exposed_comm_pct_of_window=pct(exposed, window_us),
        waiting_on_peer_us=0.0,  # needs every rank: analyze.py fills it in, with the idle split
    )
    totals_us = {"compute": round(comp.measure(), 3), "comm": round(comm_us, 3), "memory": round(mem.measure(), 3)}
    del comp, comm, mem
    top, proxy = _top_items(t, tl, windows, window_us)
    warnings = list(tl.warnings)
    if windows and windows[0].step is not None and len(windows) > 1:
        warnings.append(f"step {windows[0].step} is the first profiled step and may absorb one-off work")
    return RankSummary(
        rank=rank,
        file=str(t.path),
        timeline_basis="gpu_kernels" if tl.basis == "gpu_kernels" else "cpu_ops",
        steps_present=tl.steps_present,
        steps_analyzed=[w.step for w in windows if w.step is not None],
        step_time_us_mean=round(window_us / len(windows), 3) if windows else 0.0,
        window_us=window_us,
        partition=partition,
        idle=add_idle(idles) if idles else idle_breakdown(tl, []),
        overlap=overlap,
        totals_us=totals_us,
        per_step=per_step,
        top_items=top,
        collectives=collectives,
        launch=launch,
        memory_bound_proxy_pct_of_compute=proxy,
        hta_compat=hta,
        warnings=warnings,
    )
