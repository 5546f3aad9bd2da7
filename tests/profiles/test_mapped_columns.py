"""A rank's columns grow in maps of their own and read back exactly as ``array``s of their typecode."""

from __future__ import annotations

import gc
import math
import mmap
import weakref
from array import array

import numpy as np
import pytest

from service.profiles import mapped_columns
from service.profiles.events import column
from service.profiles.mapped_columns import GrowingColumn, empty_column, mapped_copy

N = 100_000  # 800 KB of doubles: the first 64 KB map doubles four times


def _filled(typecode: str, values: list[float] | list[int]) -> memoryview:
    col = GrowingColumn(typecode)
    for start in range(0, len(values) - 7, 97):  # batches of odd sizes, as the reader's are
        col.extend(values[start : start + 97])
    done = len(col)
    for v in values[done:]:
        col.append(v)
    assert len(col) == len(values)
    return col.finish()


@pytest.mark.parametrize(
    ("typecode", "values"),
    [
        ("d", [i * 0.25 - 7.5 for i in range(N)] + [math.inf, -0.0, 1e300]),
        ("i", [(i * 7919) % (2**31) - 2**30 for i in range(N)] + [-(2**31), 2**31 - 1]),
        ("q", [(i * 7919) << 20 for i in range(N)] + [-(2**63), 2**63 - 1]),
    ],
)
def test_a_grown_column_reads_back_as_an_array_of_its_typecode(typecode: str, values: list[float] | list[int]) -> None:
    view = _filled(typecode, values)
    expected = array(typecode, values)
    assert view.format == typecode and view.readonly
    assert len(view) == len(expected)
    assert view.tobytes() == expected.tobytes()
    assert type(view[0]) is type(expected[0]) and view[-1] == expected[-1]
    assert column(view).dtype == np.dtype(typecode)
    assert not column(view).flags.writeable


@pytest.mark.parametrize("refusal", [SystemError, OSError])  # macOS's, and an OS's refusal
def test_where_the_os_cannot_grow_a_map_in_place_the_column_is_copied_into_a_larger_one(
        monkeypatch: pytest.MonkeyPatch, refusal: type[Exception]) -> None:
    class NoMremap(mmap.mmap):
        def resize(self, newsize: int) -> None:
            raise refusal("mmap: resizing not available--no mremap()")

    made: list[int] = []

    def new_map(size: int) -> mmap.mmap:
        made.append(size)
        return NoMremap(-1, size, flags=mmap.MAP_PRIVATE)

    monkeypatch.setattr(mapped_columns, "_new_map", new_map)
    values = [float(i) for i in range(N)]
    assert _filled("d", values).tobytes() == array("d", values).tobytes()
    assert made == [64 * 1024 * 2**k for k in range(5)]  # 64 KB, then each doubling copied


def test_a_value_the_typecode_cannot_hold_is_refused_and_nothing_of_its_batch_is_kept() -> None:
    col = GrowingColumn("i")
    col.extend([1, 2])
    with pytest.raises(OverflowError):
        col.extend([3, 2**40])
    with pytest.raises(OverflowError):
        col.append(2**40)
    with pytest.raises(TypeError):
        col.append("5")
    col.append(4)
    assert col.finish().tolist() == [1, 2, 4]


def test_a_finished_column_takes_no_more_values() -> None:
    col = GrowingColumn("d")
    col.append(1.0)
    col.finish()
    with pytest.raises(ValueError, match="finished"):
        col.append(2.0)
    with pytest.raises(ValueError, match="finished"):
        col.finish()


def test_the_map_goes_when_the_last_view_of_it_is_dropped() -> None:
    view = _filled("d", [1.0, 2.0, 3.0])
    part = view[1:]
    memory = weakref.ref(view.obj)  # the mmap
    del view
    gc.collect()
    assert memory() is not None and part.tolist() == [2.0, 3.0]
    del part
    gc.collect()
    assert memory() is None


def test_mapped_copy_and_empty_columns() -> None:
    ints = np.array([-1, 0, 2**31 - 1, -(2**31)], dtype=np.int64)
    got = mapped_copy(ints, "i")
    assert got.format == "i" and got.readonly and got.tolist() == ints.tolist()
    none = mapped_copy(ints[:0], "i")
    assert len(none) == 0 and len(column(none)) == 0
    empty = empty_column("d")
    assert empty.format == "d" and len(empty) == 0 and empty.readonly
    assert len(_filled("q", [])) == 0
