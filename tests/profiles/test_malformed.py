"""Malformed input gets a TraceError naming the file; reading stays streaming and memory-bounded."""

from __future__ import annotations

import gzip
import json
import tracemalloc
from pathlib import Path

import pytest
from tracebuild import TraceBuilder

from service.profiles import TraceError, analyze_traces
from service.profiles.reader import read_trace


def _valid(tmp_path: Path, name: str = "ok.json", rank: int = 0) -> Path:
    b = TraceBuilder(rank=rank, world=2)
    b.step(1, 0, 100).kernel("sm90_gemm", 10, 50)
    return b.write(tmp_path / name)


def test_truncated_gzip(tmp_path: Path) -> None:
    full = gzip.compress(json.dumps(TraceBuilder().step(1, 0, 10).document()).encode())
    p = tmp_path / "cut.json.gz"
    p.write_bytes(full[: len(full) // 2])
    with pytest.raises(TraceError, match=r"cut\.json\.gz: truncated or corrupt gzip"):
        analyze_traces([p])


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("hello, I am not JSON", "not a JSON trace"),
        ("[1, 2, 3]", "expected a JSON object"),
        ('{"schemaVersion": 1, "traceName": "x"}', "no 'traceEvents'"),
        ('{"traceEvents": []}', "nothing to analyse"),
        (
            '{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 2, "cat": "cpu_op"}, {"ph": ',
            "invalid JSON",
        ),
        ('{"traceEvents": [3]}', "is not an object"),
        ("", "expected a JSON object"),
    ],
)
def test_bad_json_names_file_and_problem(tmp_path: Path, content: str, message: str) -> None:
    p = tmp_path / "bad.json"
    p.write_text(content)
    with pytest.raises(TraceError, match=message) as err:
        analyze_traces([p])
    assert str(p) in str(err.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot open"):
        analyze_traces([tmp_path / "nope.json"])


def test_duplicate_rank_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="rank 0 already comes from"):
        analyze_traces([_valid(tmp_path, "a.json"), _valid(tmp_path, "b.json")])


def test_oversized_single_value_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "huge_value.json"
    p.write_text('{"traceEvents": [{"name": "' + "x" * 200_000 + '"}]}')
    with pytest.raises(TraceError, match="larger than"):
        read_trace(p, lambda e: None, max_value_chars=50_000)


def _write_large(path: Path, n_events: int) -> None:
    with gzip.open(path, "wt", encoding="utf-8", compresslevel=1) as fh:
        fh.write('{"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": [')
        for i in range(n_events):
            if i:
                fh.write(",")
            fh.write(
                json.dumps(
                    {
                        "ph": "X",
                        "cat": "python_function",
                        "name": f"frame {i % 97}",
                        "pid": 1,
                        "tid": 1,
                        "ts": 1000.5 + i,
                        "dur": 0.5,
                        "args": {"Python id": i, "Python parent id": i - 1, "pad": "p" * 200},
                    }
                )
            )
        fh.write('], "traceName": "big"}')


def test_reading_is_streaming_with_bounded_memory(tmp_path: Path) -> None:
    n = 120_000  # about 40 MB of JSON once decompressed
    p = tmp_path / "big.json.gz"
    _write_large(p, n)
    with gzip.open(p, "rb") as fh:
        raw_size = sum(len(chunk) for chunk in iter(lambda: fh.read(1 << 20), b""))
    count = 0

    def consume(_: object) -> None:
        nonlocal count
        count += 1

    tracemalloc.start()
    meta = read_trace(p, consume)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert count == n and meta["traceName"] == "big"
    assert raw_size > 30_000_000
    assert peak < 12_000_000, f"peak {peak} bytes for a {raw_size}-byte trace: not streaming"
