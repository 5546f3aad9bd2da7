"""A gzip trace reads as ``gzip`` would read it: several members, zero padding, UTF-8 cut anywhere,
and the same refusals for a truncated, corrupt or non-UTF-8 file."""

from __future__ import annotations

import gzip
import itertools
import json
import random
import tracemalloc
import zlib
from pathlib import Path
from typing import Any

import pytest

from service.profiles import TraceError
from service.profiles.reader import CHUNK_CHARS, GZIP_INPUT_BYTES, read_trace

# Names of 1 to 4 UTF-8 bytes a character, so that chunk and piece boundaries fall inside characters.
_NAMES = ("gemm", "é_kernel", "全连接層", "🚀 launch", "ncclDevKernel_AllReduce_Sum_f32")


def _document(events: int) -> dict[str, Any]:
    return {"schemaVersion": 1, "deviceProperties": [{"name": "Ünïcode GPU ✓"}], "traceName": "t",
            "traceEvents": [{"ph": "X", "cat": "kernel", "name": f"{_NAMES[i % len(_NAMES)]} {i}", "ts": i, "dur": 1,
                             "args": {"stream": 7, "correlation": i}} for i in range(events)]}


def _read(path: Path) -> tuple[dict[str, Any], list[Any]]:
    events: list[Any] = []
    meta = read_trace(path, events.append)
    return meta, events


def _as_gzip_reads_it(path: Path) -> tuple[dict[str, Any], list[Any]]:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        doc = json.load(fh)
    return {k: v for k, v in doc.items() if k != "traceEvents"}, doc["traceEvents"]


@pytest.mark.parametrize("level", [0, 1, 9])  # stored blocks (inflate's output comes as fast as its input), fast, best
def test_one_member_reads_as_gzip_reads_it(tmp_path: Path, level: int) -> None:
    text = json.dumps(_document(6_000), ensure_ascii=False).encode()
    assert len(text) > 8 * CHUNK_CHARS and len(gzip.compress(text, level)) > 2 * GZIP_INPUT_BYTES
    path = tmp_path / "one.json.gz"
    path.write_bytes(gzip.compress(text, level))
    meta, events = _read(path)
    assert (meta, events) == _as_gzip_reads_it(path)
    assert events[1]["name"] == "é_kernel 1" and events[3]["name"] == "🚀 launch 3"


def test_several_members_with_zero_padding_between_and_after_read_as_one(tmp_path: Path) -> None:
    text = json.dumps(_document(4_000), ensure_ascii=False).encode()
    rocket = text.index("🚀".encode(), 50_000)
    cuts = [0, 7, 40_000, 40_001, rocket + 2, len(text)]  # one of them inside a 4-byte character
    members = [gzip.compress(text[a:b]) for a, b in itertools.pairwise(cuts)]
    path = tmp_path / "members.json.gz"
    path.write_bytes(members[0] + b"\0" * 3 + members[1] + members[2] + b"\0" * (3 * GZIP_INPUT_BYTES)
                     + b"".join(members[3:]) + b"\0" * 5)
    assert _read(path) == _as_gzip_reads_it(path)
    assert len(_read(path)[1]) == 4_000


def _bad(tmp_path: Path, data: bytes) -> str:
    path = tmp_path / "bad.json.gz"
    path.write_bytes(data)
    with pytest.raises(TraceError) as err:
        _read(path)
    assert str(path) in str(err.value)
    return str(err.value)


def test_truncated_corrupt_or_trailing_garbage_is_refused_naming_the_file(tmp_path: Path) -> None:
    whole = gzip.compress(json.dumps(_document(3_000)).encode())
    assert "truncated or corrupt gzip" in _bad(tmp_path, whole[:-4])  # the length of the trailer missing
    assert "truncated or corrupt gzip" in _bad(tmp_path, whole[: len(whole) // 2])
    wrong_crc = whole[:-8] + bytes([whole[-8] ^ 1]) + whole[-7:]
    assert "truncated or corrupt gzip" in _bad(tmp_path, wrong_crc)
    assert "truncated or corrupt gzip" in _bad(tmp_path, whole + b"not gzip")
    flipped = bytearray(whole)
    flipped[len(whole) // 2] ^= 0xFF  # inflated into garbled text before the checksum can be checked
    assert any(why in _bad(tmp_path, bytes(flipped)) for why in ("truncated or corrupt gzip", "invalid JSON"))


def test_text_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    assert "not UTF-8" in _bad(tmp_path, gzip.compress(b'{"traceEvents": [{"name": "\xff"}]}'))
    # a character cut at the very end of the file: the decoder is told the text is over
    assert "not UTF-8" in _bad(tmp_path, gzip.compress(b'{"traceEvents": []}\xe5\x85'))


def test_reading_a_gzip_trace_holds_a_few_chunks_of_text_at_most(tmp_path: Path) -> None:
    """Reading keeps a piece of the compressed input and a few chunks of text at most, whatever the
    file's size (0.4 MB compressed here)."""
    text = json.dumps(_document(40_000)).encode()
    path = tmp_path / "big.json.gz"
    path.write_bytes(gzip.compress(text, 1))
    assert path.stat().st_size > 3 * 128 * 1024
    tracemalloc.start()
    count = 0

    def consume(_: object) -> None:
        nonlocal count
        count += 1

    read_trace(path, consume)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert count == 40_000
    # a chunk as inflated bytes and as text, the buffer it joins (about 4 chunks in all), inflate's
    # window and state and one event: 264 KB measured. gzip.open's text layer also asked its buffered
    # reader for each chunk as one bytes object beside zlib's output blocks: 468 KB
    assert peak < 4 * CHUNK_CHARS + 64 * 1024, f"peak {peak} bytes"


def test_a_zlib_stream_that_is_not_gzip_is_refused(tmp_path: Path) -> None:
    data = zlib.compress(b'{"traceEvents": []}')
    assert "not a JSON trace" in _bad(tmp_path, data)  # not gzip's magic: read as text, and not JSON


_TOKENS = ('"\\u00e9"', '"\\ud83d\\ude80"', "1e+25", "-0.5e-3", "true", "false", "null", '"\\n\\""')


@pytest.mark.parametrize("gzipped", [False, True])
def test_a_value_cut_anywhere_by_the_end_of_a_chunk_reads_whole(tmp_path: Path, gzipped: bool) -> None:
    """Each token placed so that a chunk of text ends at every position inside it: the generic decoder
    reads on instead of calling the cut value invalid (an escape or a literal cut short is not)."""
    for token in _TOKENS:
        for inside in range(1, len(token)):
            head = '{"traceEvents": [{"ph": "X", "pad": "'
            tail = '", "v": '
            pad = CHUNK_CHARS - inside - len(head) - len(tail)
            text = head + "x" * pad + tail + token + "}]}"
            assert text.index(token) == CHUNK_CHARS - inside
            path = tmp_path / ("cut.json.gz" if gzipped else "cut.json")
            path.write_bytes(gzip.compress(text.encode()) if gzipped else text.encode())
            assert _read(path)[1] == json.loads(text)["traceEvents"], (token, inside)


def test_invalid_json_at_the_end_of_a_chunk_is_still_refused(tmp_path: Path) -> None:
    head = '{"traceEvents": [{"ph": "X", "pad": "'
    text = head + "x" * (CHUNK_CHARS - len(head) - 12) + '", "v": tru}, {"a": 1}]}' + " " * CHUNK_CHARS
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(TraceError, match="invalid JSON in traceEvents"):
        _read(path)


def test_random_members_and_cuts_read_as_gzip_reads_them_or_are_refused(tmp_path: Path) -> None:
    """Seeded: documents of random size and characters, split into members at random bytes, each at a
    random level with random zero padding after it, read as `gzip.decompress` gives them; the same
    file cut at a random byte is refused unless all that was cut is zero padding."""
    rng = random.Random(17)
    path = tmp_path / "random.json.gz"
    for case in range(40):
        doc = _document(rng.randint(0, 1_500))
        doc["x"] = "ü" * rng.randint(0, 70_000)
        text = json.dumps(doc, ensure_ascii=rng.random() < 0.5).encode()
        cuts = sorted(rng.sample(range(len(text) + 1), rng.randint(0, 4)))
        parts = [text[a:b] for a, b in itertools.pairwise([0, *cuts, len(text)])]
        blob = b"".join(gzip.compress(part, rng.choice([0, 1, 6, 9])) + b"\0" * rng.choice([0, 0, 1, 20_000])
                        for part in parts)
        path.write_bytes(blob)
        assert _read(path) == _as_gzip_reads_it(path), case
        cut = rng.randint(1, len(blob) - 1)
        path.write_bytes(blob[:cut])
        if blob[cut:].strip(b"\0"):
            with pytest.raises(TraceError):
                _read(path)


def test_a_large_value_in_a_gzip_trace_is_read_in_few_attempts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    """A value longer than a chunk is decoded again from its start after each read, so the reads that
    grow it must double it (whole, though a gzip file's reads come short): 4 Mi characters take a
    number of reads logarithmic in their size, where short reads took hundreds."""
    from service.profiles import reader

    path = tmp_path / "long.json.gz"
    letters = "".join(random.Random(5).choices("abcdefghijklmnopqrstuvwxyz", k=4 << 20))  # 16 KiB inflate to ~27 Ki
    path.write_bytes(gzip.compress(b'{"deviceProperties": "' + letters.encode() + b'", "traceEvents": []}'))
    reads = 0
    fill = reader._Scanner._fill

    def counted(self: reader._Scanner, chars: int = CHUNK_CHARS, **kw: bool) -> bool:
        nonlocal reads
        reads += 1
        return fill(self, chars, **kw)

    monkeypatch.setattr(reader._Scanner, "_fill", counted)
    meta, events = _read(path)
    assert meta["deviceProperties"] == letters and events == []
    assert reads <= 2 * ((4 << 20) // CHUNK_CHARS).bit_length() + 4, f"{reads} reads"
