"""Compact, columnar in-memory form of one rank's trace.

Only complete events (``ph == "X"`` with ``dur`` and ``cat``) are kept, in typed columns (36 bytes
per event instead of a Python dict each); ``python_function`` events are skipped (they only make traces
huge, as HTA's streaming backend also does). ``args`` are reduced to the ids the analysis needs
(stream, correlation) plus, for collectives and memory copies only, the size fields.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from service.profiles.errors import TraceError
from service.profiles.mapped_columns import GrowingColumn, empty_column, mapped_copy
from service.profiles.reader import DEFAULT_MAX_VALUE_CHARS, EventBatches, read_trace

DEFAULT_MAX_EVENTS = 4_000_000
"""Complete events kept per rank before a file is refused. Analysis peaks at 95-325 bytes per kept
event of the largest rank (benchmarks/profile_analyze.py measures it; 325 on CPU-only traces), so
this bounds the analysis near 1.3 GB; a profile of a few steps holds far fewer (python_function
events are skipped and do not count)."""

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


_UNSET: Any = msgspec.UNSET


class _Args(msgspec.Struct, gc=False):
    """The ``args`` fields the analysis reads; msgspec skips all others without building them."""

    stream: Any = None
    correlation: Any = None
    name: Any = _UNSET
    collective_name: Any = msgspec.field(default=_UNSET, name="Collective name")
    in_msg_nelems: Any = msgspec.field(default=_UNSET, name="In msg nelems")
    out_msg_nelems: Any = msgspec.field(default=_UNSET, name="Out msg nelems")
    group_size: Any = msgspec.field(default=_UNSET, name="Group size")
    dtype: Any = _UNSET
    input_dims: Any = msgspec.field(default=_UNSET, name="Input Dims")
    input_type: Any = msgspec.field(default=_UNSET, name="Input type")
    pg_name_long: Any = msgspec.field(default=_UNSET, name="Process Group Name")
    bytes: Any = _UNSET
    pg_ranks: Any = msgspec.field(default=_UNSET, name="Process Group Ranks")
    pg_name: Any = _UNSET


# (JSON key, struct attribute) for SIZE_ARG_KEYS, in that order
_SIZE_FIELDS = tuple(
    (f.encode_name, f.name) for f in msgspec.structs.fields(_Args) if f.encode_name in SIZE_ARG_KEYS
)
assert [k for k, _ in _SIZE_FIELDS] == list(SIZE_ARG_KEYS)


_Id = int | str | None  # a pid or tid as the fast path takes it


class _Event(msgspec.Struct, gc=False):
    """One ``traceEvents`` element as the fast path decodes it (see ``reader.EventBatches``).

    The fields the columns are built from are typed, so that msgspec checks them in C: a batch holding
    an event with any other type (a number for a name, a string for a timestamp, ``true`` for a pid)
    does not decode, and its elements go one by one through the generic decoder and ``_Builder.add``,
    which read them as before. A missing name reads as "" on both paths. A pid or tid may be a string,
    since every path keys threads by ``str()`` of both, but not a float or a bool: ``_Builder.raw_threads``
    would take ``1.0`` or ``true`` for ``1``, whose thread is "1", not "1.0" or "True"."""

    ph: Any = None
    name: str = ""
    cat: str | None = None
    ts: int | float | None = None
    dur: int | float | None = None
    pid: _Id = None
    tid: _Id = None
    args: _Args | None = None


_EVENTS_DECODER = msgspec.json.Decoder(list[_Event])
_NO_ARGS = _Args()


def _as_int(value: Any, default: int = -1) -> int:
    """HTA's rule: a value that int() cannot convert becomes the default (an infinite float too)."""
    if value is None:
        return default
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return default


def _times(path: Path, name: str, ts: Any, dur: Any) -> tuple[float, float]:
    """An event's ts and dur as floats; a ``TraceError`` naming the event where either is not a finite
    number (a string that is no number, NaN or Infinity, which Python's json reads, or an integer
    past a float's range)."""
    try:
        start, length = float(ts), float(dur)
    except (TypeError, ValueError, OverflowError) as exc:
        raise TraceError(path, f"event {name!r} has a ts or dur that is not a finite number") from exc
    if not (math.isfinite(start) and math.isfinite(length)):
        raise TraceError(path, f"event {name!r} has a ts or dur that is not a finite number")
    return start, length


_INT32 = np.iinfo(np.int32)


def narrowed(values: memoryview[int]) -> memoryview[int]:
    """``values`` as a 32-bit column when every value fits, else ``values`` itself. Stream and
    correlation ids are built 64-bit while a file is read, since their range is not known until the
    end; they almost always fit in 32. Not in 8 or 16: numpy's loops for those widths are more of its
    code read in on first use, which cost small traces more memory than the narrower columns saved."""
    ints = column(values)
    if values.format == "i" or not len(ints) or not _INT32.min <= ints.min() <= ints.max() <= _INT32.max:
        return values
    return mapped_copy(ints, "i")


def column(values: memoryview[Any]) -> npt.NDArray[Any]:
    """A read-only numpy view of one column, in the column's own type (integer columns are narrowed
    per trace, so callers must not assume a width)."""
    return np.frombuffer(values, dtype=values.format)


@dataclass
class RankTrace:
    """One rank's events in columns; index ``i`` addresses the same event in every column. Columns are
    read-only views of ``array`` typecodes, each in memory of its own (``mapped_columns``). ``stream``
    and ``correlation`` are narrowed to 32 bits once the file is read where their values fit
    (``narrowed``): read columns through ``column`` or by index, never assuming a width."""

    path: Path
    meta: dict[str, Any]
    names: list[str] = field(default_factory=list)
    cats: list[str] = field(default_factory=list)
    threads: list[tuple[str, str]] = field(default_factory=list)
    name_idx: memoryview[int] = field(default_factory=lambda: empty_column("i"))
    cat_idx: memoryview[int] = field(default_factory=lambda: empty_column("i"))
    thread_idx: memoryview[int] = field(default_factory=lambda: empty_column("i"))
    ts: memoryview[float] = field(default_factory=lambda: empty_column("d"))
    dur: memoryview[float] = field(default_factory=lambda: empty_column("d"))
    stream: memoryview[int] = field(default_factory=lambda: empty_column("q"))
    correlation: memoryview[int] = field(default_factory=lambda: empty_column("q"))
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
        self.carries_sizes: list[bool] = []  # per name id: does the name match _SIZE_CARRIERS
        self.raw_threads: dict[tuple[_Id, _Id], int] = {}  # (pid, tid) as decoded -> thread id
        self.args_seen: dict[tuple[tuple[str, type, Any], ...], dict[str, Any]] = {}
        self.ts, self.dur = GrowingColumn("d"), GrowingColumn("d")
        self.name_idx, self.cat_idx, self.thread_idx = GrowingColumn("i"), GrowingColumn("i"), GrowingColumn("i")
        self.stream, self.correlation = GrowingColumn("q"), GrowingColumn("q")

    def _shared(self, kept: dict[str, Any]) -> dict[str, Any]:
        """One dict for all events with equal size fields (every memcpy of the same size, every step's
        same collective): ``size_args`` values are shared and must not be mutated. Values that cannot
        be hashed (lists) are kept as they are."""
        key = tuple((k, type(v), v) for k, v in kept.items())  # the type: 1, 1.0 and True hash alike
        try:
            return self.args_seen.setdefault(key, kept)
        except TypeError:
            return kept

    def _intern(self, table: dict[str, int], values: list[str], key: str) -> int:
        idx = table.get(key)
        if idx is None:
            idx = table[key] = len(values)
            values.append(key)
        return idx

    def _name_id(self, name: str) -> int:
        idx = self.name_ids.get(name)
        if idx is None:
            idx = self.name_ids[name] = len(self.t.names)
            self.t.names.append(name)
            self.carries_sizes.append(_SIZE_CARRIERS.search(name) is not None)
        return idx

    def _too_many(self) -> None:
        raise TraceError(
            self.t.path,
            f"more than {self.max_events:,} complete events in one rank's trace: profile fewer steps "
            "(a shorter schedule(active=...)), or raise the limit if the memory is there "
            "(`shardctl profile analyze --max-events`; SHARDCTL_MAX_TRACE_EVENTS for uploads)",
        )

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
        if len(self.ts) >= self.max_events:
            self._too_many()
        start, length = _times(t.path, name, ts, dur)
        self.ts.append(start)
        self.dur.append(length)
        nid = self.name_ids.get(name)
        if nid is None:
            nid = self._name_id(name)
        self.name_idx.append(nid)
        self.cat_idx.append(self._intern(self.cat_ids, t.cats, str(cat)))
        key = (str(ev.get("pid")), str(ev.get("tid")))
        tidx = self.thread_ids.get(key)
        if tidx is None:
            tidx = self.thread_ids[key] = len(t.threads)
            t.threads.append(key)
        self.thread_idx.append(tidx)
        args = ev.get("args")
        if isinstance(args, dict):
            self.stream.append(_as_int(args.get("stream")))
            self.correlation.append(_as_int(args.get("correlation")))
            if self.carries_sizes[nid] or "Collective name" in args:
                kept = {k: args[k] for k in SIZE_ARG_KEYS if k in args}
                if kept:
                    t.size_args[len(self.ts) - 1] = self._shared(kept)
        else:
            self.stream.append(-1)
            self.correlation.append(-1)


    def add_batch(self, events: list[_Event]) -> None:
        """``add`` for events decoded by the fast path: the same columns, the same errors.

        Column by column; event by event (``_add_each``) for a batch with metadata events, one that
        would pass ``max_events`` or one with an integer ts or dur past a float's range, so that the
        error names the same event as ``add`` would."""
        t = self.t
        if any(ev.ph == "M" for ev in events):
            self._add_each(events)
            return
        if not t.float_timestamps and any(ev.ts is None or type(ev.ts) is float for ev in events):
            t.float_timestamps = True
        kept: list[Any] = [  # each with its ts, dur and cat: not None
            ev
            for ev in events
            if ev.dur is not None and ev.cat is not None and ev.ts is not None
            and ev.cat != "Trace" and ev.cat != "python_function"
        ]
        skipped = sum(ev.cat == "python_function" and ev.dur is not None and ev.ts is not None for ev in events)
        if len(self.ts) + len(kept) > self.max_events:
            self._add_each(events)
            return
        try:
            starts, lengths = [float(ev.ts) for ev in kept], [float(ev.dur) for ev in kept]
        except OverflowError:  # an integer past a float's range: the error names its event
            self._add_each(events)
            return
        t.total_events += len(events)
        t.skipped_python_functions += skipped
        first = len(self.ts)
        self.ts.extend(starts)
        self.dur.extend(lengths)
        name_ids, cat_ids, thread_map = self.name_ids, self.cat_ids, self.thread_ids
        name_col = [name_ids.get(ev.name, -1) for ev in kept]
        for k, nid in enumerate(name_col):
            if nid < 0:
                name_col[k] = self._name_id(kept[k].name)
        self.name_idx.extend(name_col)
        self.cat_idx.extend([
            cid if (cid := cat_ids.get(ev.cat)) is not None else self._intern(cat_ids, t.cats, ev.cat)
            for ev in kept
        ])
        raw_threads = self.raw_threads
        thread_col = [raw_threads.get((ev.pid, ev.tid), -1) for ev in kept]
        for k, tidx in enumerate(thread_col):
            if tidx < 0:
                ev = kept[k]
                key = (str(ev.pid), str(ev.tid))
                found = thread_map.get(key)
                if found is None:
                    found = thread_map[key] = len(t.threads)
                    t.threads.append(key)
                thread_col[k] = raw_threads[(ev.pid, ev.tid)] = found
        self.thread_idx.extend(thread_col)
        no_args = _NO_ARGS
        args = [ev.args or no_args for ev in kept]
        self.stream.extend([v if type(v := a.stream) is int else _as_int(v) for a in args])
        self.correlation.extend([v if type(v := a.correlation) is int else _as_int(v) for a in args])
        carries = self.carries_sizes
        for k, a in enumerate(args):
            if a is not no_args and (carries[name_col[k]] or a.collective_name is not _UNSET):
                kept_args = {key: v for key, attr in _SIZE_FIELDS if (v := getattr(a, attr)) is not _UNSET}
                if kept_args:
                    t.size_args[first + k] = self._shared(kept_args)

    def finish(self) -> None:
        """Hands the columns read to the trace, as read-only views; the builder takes no more events."""
        t = self.t
        t.ts, t.dur = self.ts.finish(), self.dur.finish()
        t.name_idx, t.cat_idx, t.thread_idx = self.name_idx.finish(), self.cat_idx.finish(), self.thread_idx.finish()
        t.stream, t.correlation = self.stream.finish(), self.correlation.finish()

    def _add_each(self, events: list[_Event]) -> None:
        t = self.t
        t.total_events += len(events)
        name_ids, cat_ids, thread_map = self.name_ids, self.cat_ids, self.thread_ids
        carries = self.carries_sizes
        ts_col, dur_col, name_col, cat_col, thread_col = self.ts, self.dur, self.name_idx, self.cat_idx, self.thread_idx
        stream_col, corr_col = self.stream, self.correlation
        for ev in events:
            ts = ev.ts
            if ts is None or type(ts) is float:
                t.float_timestamps = True
            if ev.ph == "M":
                if ev.name == "thread_name":
                    a = ev.args
                    label = "" if a is None or a.name is _UNSET else str(a.name)
                    t.thread_names[(str(ev.pid), str(ev.tid))] = label
                continue
            dur = ev.dur
            cat = ev.cat
            if dur is None or cat is None or cat == "Trace" or ts is None:
                continue
            if cat == "python_function":
                t.skipped_python_functions += 1
                continue
            name = ev.name
            if len(ts_col) >= self.max_events:
                self._too_many()
            start, length = _times(t.path, name, ts, dur)
            ts_col.append(start)
            dur_col.append(length)
            nid = name_ids.get(name)
            if nid is None:
                nid = self._name_id(name)
            name_col.append(nid)
            cid = cat_ids.get(cat)
            cat_col.append(cid if cid is not None else self._intern(cat_ids, t.cats, cat))
            key = (str(ev.pid), str(ev.tid))
            tidx = thread_map.get(key)
            if tidx is None:
                tidx = thread_map[key] = len(t.threads)
                t.threads.append(key)
            thread_col.append(tidx)
            args = ev.args
            if args is None:
                stream_col.append(-1)
                corr_col.append(-1)
                continue
            stream_col.append(_as_int(args.stream))
            corr_col.append(_as_int(args.correlation))
            if carries[nid] or args.collective_name is not _UNSET:
                kept = {k: v for k, attr in _SIZE_FIELDS if (v := getattr(args, attr)) is not _UNSET}
                if kept:
                    t.size_args[len(ts_col) - 1] = self._shared(kept)


def load_rank_trace(
    path: Path, max_value_chars: int = DEFAULT_MAX_VALUE_CHARS, max_events: int = DEFAULT_MAX_EVENTS
) -> RankTrace:
    """Stream ``path`` into a ``RankTrace``.

    Raises ``TraceError`` for unreadable or empty traces and for traces with more than ``max_events``
    complete events (memory stays bounded: the file is never held whole, and kept events are capped).
    """
    trace = RankTrace(path=path, meta={})
    builder = _Builder(trace, max_events)
    batches = EventBatches(_EVENTS_DECODER, builder.add_batch)
    trace.meta = read_trace(path, builder.add, max_value_chars=max_value_chars, batch=batches)
    builder.finish()
    if len(trace) == 0:
        raise TraceError(path, "traceEvents holds no complete ('X') events with a duration: nothing to analyse")
    trace.stream, trace.correlation = narrowed(trace.stream), narrowed(trace.correlation)
    return trace
