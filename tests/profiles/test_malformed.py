"""Malformed input gets a TraceError naming the file; reading stays streaming and memory-bounded."""

from __future__ import annotations

import gzip
import json
import struct
import tracemalloc
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest
from tracebuild import TraceBuilder

from service.profiles import TraceError, analyze_traces
from service.profiles.events import load_rank_trace
from service.profiles.reader import DEFAULT_MAX_VALUE_CHARS, read_trace


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
        (  # past Python's int_max_str_digits: msgspec refuses it too, so json meets it
            '{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 2, "cat": "kernel", "args": {"stream": '
            + "9" * 5_000 + "}}]}",
            "invalid JSON in traceEvents: Exceeds the limit",
        ),
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


TWO_GIB = 2 << 30


def _repeated_gzip(path: Path, head: bytes, block: bytes, repeats: int, tail: bytes) -> int:
    """A valid gzip file of ``head + block * repeats + tail``, written without compressing it all.

    Each block is deflated once after a full flush (no back references across blocks), so its
    compressed bytes can be repeated; the CRC and size trailer are those of the whole content.
    Returns the uncompressed size.
    """
    co = zlib.compressobj(9, zlib.DEFLATED, -15)
    crc = zlib.crc32(head)
    with path.open("wb") as fh:
        fh.write(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff")
        fh.write(co.compress(head) + co.flush(zlib.Z_FULL_FLUSH))
        packed = co.compress(block) + co.flush(zlib.Z_FULL_FLUSH)
        for _ in range(repeats):
            fh.write(packed)
            crc = zlib.crc32(block, crc)
        crc = zlib.crc32(tail, crc)
        fh.write(co.compress(tail) + co.flush())
        size = len(head) + len(block) * repeats + len(tail)
        fh.write(struct.pack("<II", crc & 0xFFFFFFFF, size & 0xFFFFFFFF))
    return size


def _peak_of(call: Callable[[], object]) -> tuple[BaseException | None, int]:
    tracemalloc.start()
    try:
        call()
        raised = None
    except TraceError as exc:
        raised = exc
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return raised, peak


def test_a_2_gib_file_of_zeros_is_refused_at_once(tmp_path: Path) -> None:
    p = tmp_path / "zeros.json"
    with p.open("wb") as fh:  # sparse: 2 GiB on paper, nothing on disk
        fh.truncate(TWO_GIB)
    assert p.stat().st_size == TWO_GIB
    err, peak = _peak_of(lambda: analyze_traces([p]))
    assert err is not None and "expected a JSON object" in str(err) and str(p) in str(err)
    assert peak < 8_000_000


def test_a_2_gib_trace_with_garbage_after_the_header_names_the_problem(tmp_path: Path) -> None:
    p = tmp_path / "garbage.json"
    with p.open("wb") as fh:
        fh.write(b'{"schemaVersion": 1, "traceEvents": [')
        fh.truncate(TWO_GIB)
    err, peak = _peak_of(lambda: analyze_traces([p]))
    assert err is not None and "invalid JSON in traceEvents" in str(err)
    assert peak < 8_000_000


def test_a_2_gib_gzip_bomb_stops_at_the_value_limit(tmp_path: Path) -> None:
    """2 GiB of one JSON string, 2 MB on disk: refused once the string passes the value limit."""
    p = tmp_path / "bomb.json.gz"
    size = _repeated_gzip(p, b'{"traceEvents": [{"name": "', b"x" * (1 << 20), 2048, b'"}]}')
    assert size > TWO_GIB and p.stat().st_size < 4_000_000
    err, peak = _peak_of(lambda: analyze_traces([p]))
    assert err is not None and "larger than" in str(err) and "refusing to buffer" in str(err)
    assert peak < 3 * DEFAULT_MAX_VALUE_CHARS, f"peak {peak} bytes: the buffer grew past the limit"


def test_long_whitespace_runs_stream_through(tmp_path: Path) -> None:
    p = tmp_path / "spaces.json.gz"
    _repeated_gzip(p, b'{"traceEvents": [', b" \n\t" * (1 << 18), 96, b"]}")  # 72 MiB of whitespace
    seen: list[object] = []
    err, peak = _peak_of(lambda: read_trace(p, seen.append))
    assert err is None and seen == []
    assert peak < 12_000_000


def test_more_events_than_the_limit_are_refused_with_the_fix(tmp_path: Path) -> None:
    b = TraceBuilder(rank=0, world=1)
    b.step(1, 0, 10_000)
    for k in range(600):
        b.kernel("sm90_gemm", 10 + k * 10, 5)
    p = b.write(tmp_path / "many.json")
    assert analyze_traces([p], max_events=5_000).ranks["0"].steps_present == [1]
    with pytest.raises(TraceError, match=r"more than 500 complete events.*profile fewer steps") as err:
        analyze_traces([p], max_events=500)
    assert str(p) in str(err.value)


def _undeclared(tmp_path: Path, name: str, kernel_us: float) -> Path:
    """A trace without distributedInfo, whose single kernel's length tells which file it was."""
    b = TraceBuilder()
    b.step(1, 0, 100).kernel("sm90_gemm", 10, kernel_us)
    doc = b.document()
    del doc["distributedInfo"]
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def test_files_without_ranks_take_the_argument_order(tmp_path: Path) -> None:
    a, b = _undeclared(tmp_path, "a.json", 30), _undeclared(tmp_path, "b.json", 60)
    s = analyze_traces([b, a])
    assert s.ranks_present == [0, 1]
    assert s.ranks["0"].file == str(b) and s.ranks["0"].totals_us["compute"] == 60
    assert s.ranks["1"].file == str(a) and s.ranks["1"].totals_us["compute"] == 30


@pytest.mark.parametrize("undeclared_first", [True, False])
def test_a_file_without_a_rank_among_files_with_one_is_named(tmp_path: Path, undeclared_first: bool) -> None:
    bare, ranked = _undeclared(tmp_path, "bare.json", 30), _valid(tmp_path, "ranked.json", rank=1)
    files = [bare, ranked] if undeclared_first else [ranked, bare]
    with pytest.raises(TraceError, match=r"no distributedInfo\.rank while other files have one") as err:
        analyze_traces(files)
    assert err.value.path == bare


def test_peak_memory_is_one_ranks_not_all_ranks(tmp_path: Path) -> None:
    """Each rank's events are dropped before the next file is read: six ranks cost about one."""

    def rank_file(rank: int) -> Path:
        b = TraceBuilder(rank=rank, world=6)
        for step in range(4):
            b.step(step + 1, step * 20_000, 19_000)
            for k in range(1_500):
                b.kernel("sm90_gemm", step * 20_000 + 10 + k * 12, 8)
        return b.write(tmp_path / f"rank-{rank}.json.gz", gz=True)

    files = [rank_file(r) for r in range(6)]
    _, one = _peak_of(lambda: analyze_traces(files[:1]))
    _, six = _peak_of(lambda: analyze_traces(files))
    assert six < 1.5 * one, f"one rank peaks at {one} bytes, six at {six}"


def test_a_large_value_under_the_limit_is_rescanned_a_logarithmic_number_of_times(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 16 MiB metadata value is read whole. Each decode attempt of a value that does not end in the
    buffer rescans it from its start, so the reader reads on by as much again as it holds: about
    log2(16 MiB / 32 KiB) = 9 attempts for it (15 for the whole file), where a chunk at a time would
    take 512 and time quadratic in the value's size."""
    attempts = [0]

    class Counting(json.JSONDecoder):
        def raw_decode(self, s: str, idx: int = 0) -> tuple[object, int]:
            attempts[0] += 1
            return super().raw_decode(s, idx)

    monkeypatch.setattr("service.profiles.reader.json.JSONDecoder", Counting)
    big = "x" * (16 << 20)
    p = tmp_path / "big.json"
    p.write_text('{"traceEvents": [], "deviceProperties": "' + big + '", "schemaVersion": 1}')
    meta = read_trace(p, lambda _: None)
    assert meta["deviceProperties"] == big and meta["schemaVersion"] == 1
    assert attempts[0] <= 16, f"{attempts[0]} decode attempts for one 16 MiB value"


def test_kernels_without_a_launch_call_give_no_launch_figures(tmp_path: Path) -> None:
    """A GPU trace with no cudaLaunchKernel on the CPU side (only device activity was recorded)."""
    p = tmp_path / "device_only.json"
    p.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "name": "k", "cat": "kernel", "ts": 5, "dur": 2, "pid": 1, "tid": 1, "args": {"stream": 3}},
    ]}))
    rank = analyze_traces([p]).ranks["0"]
    assert rank.timeline_basis == "gpu_kernels" and rank.partition.compute_only_us == 2.0
    assert rank.launch is not None and rank.launch.n_launches == 0


def test_an_infinite_stream_id_is_no_stream_as_any_id_int_cannot_read(tmp_path: Path) -> None:
    kernel = '{"ph": "X", "name": "k", "cat": "kernel", "ts": 5, "dur": 2, "pid": 1, "tid": 1, "args": {"stream": %s}}'
    streams = {}
    for stream in ("1e400", '"three"', "3"):
        p = tmp_path / "stream.json"
        p.write_text('{"traceEvents": [%s]}' % (kernel % stream))
        streams[stream] = load_rank_trace(p).stream[0]
    assert streams == {"1e400": -1, '"three"': -1, "3": 3}
