"""Stream and correlation ids are narrowed to 32 bits once a trace is read; ids past 32 bits keep
their 64-bit column and analyse exactly as small ones do."""

from __future__ import annotations

import gzip
import json
from array import array
from pathlib import Path
from typing import Any

import numpy as np

from service.profiles import analyze_traces
from service.profiles.events import column, load_rank_trace, narrowed

FIXTURE = Path(__file__).parent / "fixtures" / "synthetic_gpu" / "rank-0.json.gz"
SHIFT = 2**40  # correlation ids that need 64 bits


def _col(typecode: str, values: list[int]) -> memoryview:
    return memoryview(array(typecode, values)).toreadonly()


def test_narrowed_is_32_bit_where_every_value_fits_and_else_the_same_column() -> None:
    small = _col("q", [-1, 0, 7, 2**31 - 1])
    got = narrowed(small)
    assert got.format == "i"
    assert got.readonly
    assert got.tolist() == small.tolist()
    assert column(got).dtype == np.int32

    wide = _col("q", [-1, 2**31])
    assert narrowed(wide) is wide
    low = _col("q", [-(2**31) - 1, 0])
    assert narrowed(low) is low
    assert column(wide).dtype == np.int64
    assert column(wide).tolist() == [-1, 2**31]

    empty = _col("q", [])
    assert narrowed(empty) is empty
    already = _col("i", [1, 2])
    assert narrowed(already) is already


def _shifted_copy(tmp_path: Path) -> Path:
    doc: dict[str, Any] = json.loads(gzip.decompress(FIXTURE.read_bytes()))
    shifted = 0
    for ev in doc["traceEvents"]:
        args = ev.get("args")
        if isinstance(args, dict) and isinstance(args.get("correlation"), int) and args["correlation"] >= 0:
            args["correlation"] += SHIFT
            shifted += 1
    assert shifted > 20  # the fixture's launches and kernels are linked by correlation
    out = tmp_path / "rank-0.json"
    out.write_text(json.dumps(doc))
    return out


def test_loaded_columns_are_narrow_unless_the_values_need_more(tmp_path: Path) -> None:
    plain = load_rank_trace(FIXTURE)
    assert {plain.stream.format, plain.correlation.format, plain.name_idx.format} == {"i"}
    assert (plain.ts.format, plain.dur.format) == ("d", "d")
    shifted = load_rank_trace(_shifted_copy(tmp_path))
    assert shifted.correlation.format == "q"
    assert shifted.stream.format == "i"
    expected = [c + SHIFT if c >= 0 else c for c in plain.correlation]
    assert shifted.correlation.tolist() == expected


def test_ids_past_32_bits_give_the_same_summary(tmp_path: Path) -> None:
    plain = analyze_traces([FIXTURE]).model_dump()
    shifted = analyze_traces([_shifted_copy(tmp_path)]).model_dump()
    for summary in (plain, shifted):
        for rank in summary["ranks"].values():
            rank.pop("file")
    assert shifted == plain
    assert plain["ranks"]["0"]["launch"]["n_launches"] > 0  # correlation matching was exercised
