"""Per-rank class unions (compute / comm / memory) and step windows, for GPU or CPU-only traces.

GPU traces (``timeline_basis="gpu_kernels"``): events on GPU streams, classed by ``classify_gpu_event``;
each ``ProfilerStep#N`` maps to the device window [first start, last end] of the GPU events launched
from it (linked by ``correlation``). CPU-only traces (``"cpu_ops"``, e.g. gloo): communication is the
union of backend ops (``gloo:*``...) on any thread; compute is the union of ``cpu_op`` events on the
training threads minus collective enqueue ops, copy ops (memory proxy) and DataLoader time.
"""

from __future__ import annotations

import bisect
import re
from array import array
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from service.profiles.classify import (
    COMM_BACKEND_OP,
    COMM_ENQUEUE_OP,
    CPU_COPY_OP,
    DATA_LOADER,
    GPU_EVENT_CATS,
    HOST_SYNC_OP,
    PROFILER_STEP,
    EventClass,
    classify_gpu_event,
)
from service.profiles.events import RankTrace, column
from service.profiles.intervals import Spans, Union, subtract, union, union_of_arrays

GPU_CLASSES = ("kernel", "Kernel", "gpu_memcpy", "gpu_memset", "Memcpy", "Memset")
CLASSES = tuple(EventClass)
"""``Timeline.item_class`` holds indices into this tuple."""
_CODE = {c: np.int8(k) for k, c in enumerate(CLASSES)}


@dataclass(slots=True)
class Window:
    step: int | None
    start: float
    end: float


@dataclass
class Timeline:
    basis: str
    compute: Spans
    comm: Spans
    memory: Spans
    data_loader: Union
    host_sync: Union
    windows: list[Window]
    steps_present: list[int]
    item_events: npt.NDArray[np.intp]  # event indices, ascending
    item_class: npt.NDArray[np.int8]  # per item event, its class as an index into CLASSES
    gpu_starts: array[float] = field(default_factory=lambda: array("d"))
    gpu_launch_ts: array[float] = field(default_factory=lambda: array("d"))
    warnings: list[str] = field(default_factory=list)


def _step_events(t: RankTrace) -> tuple[int | None, list[tuple[int, int]]]:
    """(step thread, [(step number, event index)]) for ProfilerStep#N annotations on the CPU side."""
    found: list[tuple[int, int]] = []
    per_thread: Counter[int] = Counter()
    step_of = [PROFILER_STEP.match(n) for n in t.names]
    for i in range(len(t)):
        if t.stream[i] >= 0:
            continue
        m = step_of[t.name_idx[i]]
        if m and t.cat(i) != "gpu_user_annotation":
            found.append((int(m.group(1)), i))
            per_thread[t.thread_idx[i]] += 1
    if not found:
        return None, []
    thread = max(per_thread, key=per_thread.__getitem__)  # most_common(1): the first of the most; no heapq
    steps = sorted((s, i) for s, i in found if t.thread_idx[i] == thread)
    return thread, steps


def build_timeline(t: RankTrace) -> Timeline:
    gpu_class = [c in GPU_CLASSES for c in t.cats]
    has_gpu = any(s >= 0 and gpu_class[c] for s, c in zip(t.stream, t.cat_idx, strict=True))
    return _gpu_timeline(t) if has_gpu else _cpu_timeline(t)


def _named_union(t: RankTrace, rx: re.Pattern[str], threads: set[int] | None = None) -> Union:
    matches = [rx.match(n) is not None for n in t.names]
    if not any(matches):
        return []
    return union(
        (t.ts[i], t.ts[i] + t.dur[i])
        for i in range(len(t))
        if t.stream[i] < 0 and (threads is None or t.thread_idx[i] in threads) and matches[t.name_idx[i]]
    )


def _launch_times(
    launch_corrs: npt.NDArray[np.longlong], launch_ts: npt.NDArray[np.float64], corrs: npt.NDArray[np.longlong]
) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.float64]]:
    """For each correlation id in ``corrs``: whether it has a launch, and its launch time (-inf if none)."""
    if len(launch_corrs) == 0:
        return np.zeros(len(corrs), dtype=bool), np.full(len(corrs), -np.inf)
    pos = np.minimum(np.searchsorted(launch_corrs, corrs), len(launch_corrs) - 1)
    found = launch_corrs[pos] == corrs
    return found, np.where(found, launch_ts[pos], -np.inf)


def _unique_inverse(values: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.intp]]:
    """``np.unique(values, return_inverse=True)``, sorting with the stable argsort (as `stable_sorted`
    does, and for the same reason: `np.unique` sorts with numpy's vectorised quicksort)."""
    order = np.argsort(values, kind="stable")
    ranked = values[order]
    first = np.empty(len(ranked), dtype=bool)
    first[:1] = True
    np.not_equal(ranked[1:], ranked[:-1], out=first[1:])
    which = np.empty(len(values), dtype=np.intp)
    # each position's run number, by repeating run ids (np.cumsum of the bool mask would read in
    # numpy's bool-to-integer casts, used nowhere else)
    first_at = np.flatnonzero(first)
    which[order] = np.repeat(np.arange(len(first_at)), np.diff(first_at, append=len(ranked)))
    return ranked[first], which


def _gpu_timeline(t: RankTrace) -> Timeline:
    ts = column(t.ts)
    dur = column(t.dur)
    stream = column(t.stream)
    corr = column(t.correlation)
    cat_idx = column(t.cat_idx)
    on_gpu_cat = np.array([c in GPU_EVENT_CATS for c in t.cats], dtype=bool)
    on_gpu = np.flatnonzero((stream >= 0) & on_gpu_cat[cat_idx])
    # classify_gpu_event once per distinct (name, category, has a "Collective name" arg)
    collective = np.array(sorted(i for i, a in t.size_args.items() if "Collective name" in a), dtype=np.intp)
    combo = column(t.name_idx)[on_gpu].astype(np.int64) * len(t.cats) + cat_idx[on_gpu]
    combo *= 2
    is_collective = np.zeros(len(t), dtype=bool)
    is_collective[collective] = True
    combo[is_collective[on_gpu]] += 1  # np.isin, and adding its bools, read in more of numpy's code
    del is_collective
    distinct, which = _unique_inverse(combo)
    codes = np.array(
        [_CODE[classify_gpu_event(t.names[c // 2 // len(t.cats)], t.cats[c // 2 % len(t.cats)], bool(c % 2))]
         for c in distinct.tolist()],
        dtype=np.int8,
    )
    item_class = codes[which].reshape(-1) if len(on_gpu) else np.zeros(0, dtype=np.int8)
    del combo, which

    def class_union(cls: EventClass) -> Spans:
        idx = on_gpu[item_class == _CODE[cls]]
        return union_of_arrays(ts[idx], ts[idx] + dur[idx])

    # the launch time of each correlation id: its first CPU-side event
    launchers = np.flatnonzero((stream < 0) & (corr >= 0))
    launch_corrs, first = np.unique(corr[launchers], return_index=True)
    launch_ts = ts[launchers[first]]
    del launchers, first
    gpu = on_gpu[item_class != _CODE[EventClass.other]]
    by_start = gpu[np.argsort(ts[gpu], kind="stable")]
    tl = Timeline(
        basis="gpu_kernels",
        compute=class_union(EventClass.compute),
        comm=class_union(EventClass.comm),
        memory=class_union(EventClass.memory),
        data_loader=_named_union(t, DATA_LOADER),
        host_sync=_named_union(t, HOST_SYNC_OP),
        windows=[],
        steps_present=[],
        item_events=on_gpu,
        item_class=item_class,
        gpu_starts=array("d", ts[by_start].tobytes()),
        gpu_launch_ts=array("d", _launch_times(launch_corrs, launch_ts, corr[by_start])[1].tobytes()),
    )
    del by_start
    if not tl.comm and t.meta.get("distributedInfo", {}).get("backend") == "nccl":
        tl.warnings.append("backend is nccl but no communication kernels were recognised")
    _, steps = _step_events(t)
    tl.steps_present = [s for s, _ in steps]
    if not steps:
        if len(gpu):
            tl.windows = [Window(None, float(ts[gpu].min()), float((ts[gpu] + dur[gpu]).max()))]
        tl.warnings.append("no ProfilerStep annotations: the window is the span of all GPU events")
        return tl
    starts = np.array([t.ts[si] for _, si in steps])
    step_ends = starts + np.array([t.dur[si] for _, si in steps])
    launched, lt = _launch_times(launch_corrs, launch_ts, corr[gpu])
    del launch_corrs, launch_ts
    k = np.searchsorted(starts, lt, side="right") - 1
    in_step = launched & (k >= 0)
    in_step[in_step] = lt[in_step] < step_ends[k[in_step]]
    del launched, lt
    k, stepped = k[in_step], gpu[in_step]
    del in_step
    lo = np.full(len(steps), np.inf)
    hi = np.full(len(steps), np.inf)  # negated
    np.minimum.at(lo, k, ts[stepped])
    # the largest end as the smallest negated end: np.maximum.at's loop is code read in for this alone
    np.minimum.at(hi, k, 0.0 - (ts[stepped] + dur[stepped]))
    hi = 0.0 - hi
    for (step, si), low, high in zip(steps, lo.tolist(), hi.tolist(), strict=True):
        if high > low:
            tl.windows.append(Window(step, low, high))
        else:
            tl.windows.append(Window(step, t.ts[si], t.ts[si] + t.dur[si]))
    return tl


def _cpu_timeline(t: RankTrace) -> Timeline:
    step_thread, steps = _step_events(t)
    comm_threads = {t.thread_idx[i] for i in range(len(t)) if COMM_BACKEND_OP.match(t.name(i))}
    comm = union((t.ts[i], t.ts[i] + t.dur[i]) for i in range(len(t)) if COMM_BACKEND_OP.match(t.name(i)))
    warnings: list[str] = []
    op_threads = {t.thread_idx[i] for i in range(len(t)) if t.cat(i) == "cpu_op"} - comm_threads
    if step_thread is not None:
        pid = t.threads[step_thread][0]
        op_threads = {th for th in op_threads if t.threads[th][0] == pid} | {step_thread}
    enqueue = _named_union(t, COMM_ENQUEUE_OP, op_threads)
    if not comm and enqueue:
        comm = enqueue
        warnings.append(
            "no backend collective spans (gloo:/nccl:...): communication approximated by the "
            "c10d enqueue ops, which miss the time spent waiting"
        )
    loader = _named_union(t, DATA_LOADER, op_threads)
    ops = union(
        (t.ts[i], t.ts[i] + t.dur[i])
        for i in range(len(t))
        if t.cat(i) == "cpu_op" and t.thread_idx[i] in op_threads
    )
    memory = subtract(subtract(_named_union(t, CPU_COPY_OP, op_threads), enqueue), loader)
    compute = subtract(subtract(subtract(ops, enqueue), memory), loader)
    items = [i for i in range(len(t)) if t.cat(i) == "cpu_op" and t.thread_idx[i] in op_threads]
    name_class = [
        _CODE[
            EventClass.comm
            if COMM_ENQUEUE_OP.match(n)
            else EventClass.memory
            if CPU_COPY_OP.match(n)
            else EventClass.compute
        ]
        for n in t.names
    ]
    item_class = np.array([name_class[t.name_idx[i]] for i in items], dtype=np.int8)
    tl = Timeline(
        basis="cpu_ops",
        compute=Spans.of(compute),
        comm=Spans.of(comm),
        memory=Spans.of(memory),
        data_loader=loader,
        host_sync=[],
        windows=[Window(s, t.ts[i], t.ts[i] + t.dur[i]) for s, i in steps],
        steps_present=[s for s, _ in steps],
        item_events=np.array(items, dtype=np.intp),
        item_class=item_class,
        warnings=warnings,
    )
    if not steps and items:
        tl.windows = [Window(None, min(t.ts[i] for i in items), max(t.ts[i] + t.dur[i] for i in items))]
        tl.warnings.append("no ProfilerStep annotations: the window is the span of all CPU ops")
    return tl


def next_gpu_launch(tl: Timeline, at: float) -> float | None:
    """Launch time of the first GPU event that starts at or after ``at`` (None if none)."""
    k = bisect.bisect_left(tl.gpu_starts, at)
    return tl.gpu_launch_ts[k] if k < len(tl.gpu_starts) else None
