"""The batched msgspec path reads every trace exactly as the generic decoder does, odd ones included."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from service.profiles.errors import TraceError
from service.profiles.events import _EVENTS_DECODER, RankTrace, _Builder, load_rank_trace
from service.profiles.reader import EventBatches, read_trace


def _generic(path: Path) -> RankTrace:
    """The same columns, built from the generic decoder's dicts alone (no batches)."""
    trace = RankTrace(path=path, meta={})
    builder = _Builder(trace, 10**9)
    trace.meta = read_trace(path, builder.add)
    builder.finish()
    return trace


def _columns(t: RankTrace) -> dict[str, object]:
    return {
        "names": [t.names[i] for i in t.name_idx],
        "cats": [t.cats[i] for i in t.cat_idx],
        "threads": [t.threads[i] for i in t.thread_idx],
        "tables": (t.names, t.cats, t.threads),  # the same ids too, not only the same values
        "ts": [repr(x) for x in t.ts], "dur": [repr(d) for d in t.dur],  # NaN != NaN; -0.0 == 0.0
        "stream": list(t.stream), "correlation": list(t.correlation),
        "size_args": t.size_args, "thread_names": t.thread_names, "float_timestamps": t.float_timestamps,
        "skipped": t.skipped_python_functions, "total": t.total_events, "meta": t.meta,
    }


def test_odd_events_read_the_same_by_both_paths(tmp_path: Path) -> None:
    events: list[dict[str, object]] = []
    for i in range(3_000):
        events.append({"ph": "X", "cat": "kernel", "name": f"gemm_{i % 7}", "pid": 0, "tid": 7, "ts": 1000 + i,
                       "dur": 0.5, "args": {"stream": 7, "correlation": i, "unused": {"a": [1, {"b": "}, {"}]}}})
        if i % 500 == 1:  # a string that looks like an element boundary
            events.append({"ph": "X", "cat": "cpu_op", "name": 'weird "}, {" name', "pid": "host", "tid": 1.0,
                           "ts": 1000.25 + i, "dur": 2, "args": {"External id": "17"}})
        if i % 700 == 3:  # args that are not an object, a name that is not a string, a metadata event
            events.append({"ph": "X", "cat": "cpu_op", "name": 12, "pid": 1, "tid": 1, "ts": 1000 + i, "dur": 1,
                           "args": ["not", "an", "object"]})
            events.append({"ph": "M", "name": "thread_name", "pid": 1, "tid": i, "args": {"name": f"t{i}"}})
        if i % 900 == 5:  # sizes on a collective, python_function and Trace rows that are skipped
            events.append({"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce", "pid": 0, "tid": 9,
                           "ts": 1000 + i, "dur": 3, "args": {"stream": 9, "correlation": -5, "In msg nelems": 10,
                                                               "dtype": "Float", "Collective name": None}})
            events.append({"ph": "X", "cat": "python_function", "name": "f", "pid": 1, "tid": 1, "ts": i, "dur": 1})
            events.append({"ph": "X", "cat": "Trace", "name": "whole", "pid": 1, "tid": 1, "ts": i, "dur": 1})
        if i % 100 == 0:  # a CPU thread whose raw (pid, tid) equals (True, 1.0) below: a different thread
            events.append({"ph": "X", "cat": "cpu_op", "name": "b", "pid": 1, "tid": 1, "ts": i or -0.0, "dur": 1})
        # types the fast path's struct refuses, one per batch: each reads as the generic decoder reads it
        if i % 800 == 7:
            events.append({"ph": "X", "cat": "cpu_op", "name": "a", "pid": True, "tid": 1.0, "ts": i, "dur": 1})
        if i % 800 == 207:
            events.append({"ph": "X", "cat": "cpu_op", "name": None, "pid": 1, "tid": 1, "ts": i, "dur": 1})
        if i % 800 == 407:
            events.append({"ph": "X", "cat": 5, "name": "c", "pid": 1, "tid": 1, "ts": i, "dur": 1})
        if i % 800 == 507:
            events.append({"ph": "X", "cat": "cpu_op", "name": "d", "pid": 1, "tid": 1, "ts": "7", "dur": 1})
        if i % 800 == 607:  # no name, a pid that is a string
            events.append({"ph": "X", "cat": "cpu_op", "pid": "1", "tid": 1, "ts": i, "dur": 1})
    text = json.dumps({"schemaVersion": 1, "traceEvents": events, "traceName": "odd"}, indent=1)
    path = tmp_path / "odd.json"
    path.write_text(text)
    batched: list[int] = []
    singles: list[int] = []
    read_trace(path, lambda _: singles.append(1), batch=EventBatches(_EVENTS_DECODER, lambda b: batched.append(len(b))))
    assert sum(batched) > 1_000 and singles  # both paths ran on this file
    fast, slow = load_rank_trace(path), _generic(path)
    assert len(fast) > 3_000
    assert _columns(fast) == _columns(slow)


@pytest.mark.parametrize("field", ["ts", "dur"])
@pytest.mark.parametrize("value", ["soon", "NaN", "-Infinity", "1e400", "9" * 400], ids=lambda v: v[:8])
def test_a_timestamp_or_duration_that_is_no_finite_number_is_an_error_naming_the_event(
        tmp_path: Path, field: str, value: str) -> None:
    """Python's json reads NaN, Infinity and 1e400 (as infinity); msgspec refuses them, so their batch
    goes through the generic decoder. A 400-digit integer passes msgspec and goes past a float."""
    events: list[dict[str, object]] = [
        {"ph": "X", "cat": "kernel", "name": f"k{i}", "pid": 0, "tid": 7, "ts": 1000 + i, "dur": 1}
        for i in range(2_000)
    ]
    events[1_500][field] = "@"
    path = tmp_path / "late.json"
    literal = json.dumps(value) if value == "soon" else value
    path.write_text(json.dumps({"traceEvents": events}).replace('"@"', literal))
    with pytest.raises(TraceError, match=r"event 'k1500' has a ts or dur that is not a finite number"):
        load_rank_trace(path)
