"""Compact, columnar in-memory form of one rank's trace.

Only complete events (``ph == "X"`` with ``dur`` and ``cat``) are kept, in typed arrays (about 60 bytes
per event instead of a Python dict each); ``python_function`` events are skipped (they only make traces
huge, as HTA's streaming backend also does). ``args`` are reduced to the ids the analysis needs
(stream, correlation, External id) plus, for collectives and memory copies only, the size fields.
"""

from __future__ import annotations

import re
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from service.profiles.errors import TraceError
from service.profiles.reader import DEFAULT_MAX_VALUE_CHARS, read_trace

DEFAULT_MAX_EVENTS = 4_000_000
"""Complete events kept per rank before a file is refused. Analysis peaks at 330-500 bytes per kept
event of the largest rank (benchmarks/profile_analyze.py measures it), so this bounds the analysis
near 2 GB; a profile of a few steps holds far fewer (python_function events are skipped and do not
count)."""

SIZE_ARG_KEYS = (
    "Collective name",
    "In msg nelems",
    "Out msg nelems",
    "Group size",
    "dtype",
    "Input Dims",
    "Input type",
    "Process Group Name",
    "bytes",
    "Process Group Ranks",
    "pg_name",
)
_SIZE_CARRIERS = re.compile(
    r"^(gloo|nccl|mpi|ucc|xccl|hccl|rccl):|^record_param_comms$|^c10d::|nccl|^Memcpy|^Memset", re.I
)


def _as_int(value: Any, default: int = -1) -> int:
    """HTA's rule: a value that int() cannot convert becomes the default."""
    if value is None:
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


@dataclass
class RankTrace:
    """One rank's events in columns; index ``i`` addresses the same event in every column."""

    path: Path
    meta: dict[str, Any]
    names: list[str] = field(default_factory=list)
    cats: list[str] = field(default_factory=list)
    threads: list[tuple[str, str]] = field(default_factory=list)
    name_idx: array[int] = field(default_factory=lambda: array("i"))
    cat_idx: array[int] = field(default_factory=lambda: array("i"))
    thread_idx: array[int] = field(default_factory=lambda: array("i"))
    ts: array[float] = field(default_factory=lambda: array("d"))
    dur: array[float] = field(default_factory=lambda: array("d"))
    stream: array[int] = field(default_factory=lambda: array("q"))
    correlation: array[int] = field(default_factory=lambda: array("q"))
    external_id: array[int] = field(default_factory=lambda: array("q"))
    size_args: dict[int, dict[str, Any]] = field(default_factory=dict)
    thread_names: dict[tuple[str, str], str] = field(default_factory=dict)
    float_timestamps: bool = False
    skipped_python_functions: int = 0
    total_events: int = 0

    def __len__(self) -> int:
        return len(self.ts)

    @property
    def rank(self) -> int | None:
        info = self.meta.get("distributedInfo")
        if isinstance(info, dict):
            rank = info.get("rank")
            if isinstance(rank, int):
                return rank
        return None

    def name(self, i: int) -> str:
        return self.names[self.name_idx[i]]

    def cat(self, i: int) -> str:
        return self.cats[self.cat_idx[i]]


class _Builder:
    def __init__(self, trace: RankTrace, max_events: int) -> None:
        self.t = trace
        self.max_events = max_events
        self.name_ids: dict[str, int] = {}
        self.cat_ids: dict[str, int] = {}
        self.thread_ids: dict[tuple[str, str], int] = {}

    def _intern(self, table: dict[str, int], values: list[str], key: str) -> int:
        idx = table.get(key)
        if idx is None:
            idx = table[key] = len(values)
            values.append(key)
        return idx

    def add(self, ev: Any) -> None:
        t = self.t
        t.total_events += 1
        if not isinstance(ev, dict):
            raise TraceError(t.path, f"traceEvents element {t.total_events - 1} is not an object")
        ts = ev.get("ts")
        if ts is None or isinstance(ts, float):
            t.float_timestamps = True
        ph = ev.get("ph")
        if ph == "M":
            if ev.get("name") == "thread_name":
                args = ev.get("args") or {}
                t.thread_names[(str(ev.get("pid")), str(ev.get("tid")))] = str(args.get("name", ""))
            return
        dur = ev.get("dur")
        cat = ev.get("cat")
        if dur is None or cat is None or cat == "Trace" or ts is None:
            return
        if cat == "python_function":
            t.skipped_python_functions += 1
            return
        name = str(ev.get("name", ""))
        if len(t.ts) >= self.max_events:
            raise TraceError(
                t.path,
                f"more than {self.max_events:,} complete events in one rank's trace: profile fewer steps "
                "(a shorter schedule(active=...)), or raise the limit if the memory is there "
                "(`shardctl profile analyze --max-events`; SHARDCTL_MAX_TRACE_EVENTS for uploads)",
            )
        try:
            t.ts.append(float(ts))
            t.dur.append(float(dur))
        except (TypeError, ValueError) as exc:
            raise TraceError(t.path, f"event {name!r} has a non-numeric ts/dur") from exc
        i = len(t.ts) - 1
        t.name_idx.append(self._intern(self.name_ids, t.names, name))
        t.cat_idx.append(self._intern(self.cat_ids, t.cats, str(cat)))
        key = (str(ev.get("pid")), str(ev.get("tid")))
        tidx = self.thread_ids.get(key)
        if tidx is None:
            tidx = self.thread_ids[key] = len(t.threads)
            t.threads.append(key)
        t.thread_idx.append(tidx)
        args = ev.get("args")
        if isinstance(args, dict):
            t.stream.append(_as_int(args.get("stream")))
            t.correlation.append(_as_int(args.get("correlation")))
            t.external_id.append(_as_int(args.get("External id")))
            if _SIZE_CARRIERS.search(name) or "Collective name" in args:
                kept = {k: args[k] for k in SIZE_ARG_KEYS if k in args}
                if kept:
                    t.size_args[i] = kept
        else:
            t.stream.append(-1)
            t.correlation.append(-1)
            t.external_id.append(-1)


def load_rank_trace(
    path: Path, max_value_chars: int = DEFAULT_MAX_VALUE_CHARS, max_events: int = DEFAULT_MAX_EVENTS
) -> RankTrace:
    """Stream ``path`` into a ``RankTrace``.

    Raises ``TraceError`` for unreadable or empty traces and for traces with more than ``max_events``
    complete events (memory stays bounded: the file is never held whole, and kept events are capped).
    """
    trace = RankTrace(path=path, meta={})
    builder = _Builder(trace, max_events)
    trace.meta = read_trace(path, builder.add, max_value_chars=max_value_chars)
    if len(trace) == 0:
        raise TraceError(path, "traceEvents holds no complete ('X') events with a duration: nothing to analyse")
    return trace
