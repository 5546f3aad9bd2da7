"""A rank's columns in anonymous memory maps of their own, outside the C heap.

Columns grow while a file is read. As ``array.array``s, seven of them growing side by side by
``realloc`` left their old copies behind as holes in the C heap that stayed resident under the rank's
analysis until its trim: reading a rank of 20,060 events grew the heap by 1.4 MB for 0.7 MB of
columns, 0.3 MB with maps (``benchmarks/trace_stages.py``). A map's untouched pages take no memory,
growing one moves it without a copy where the OS can (``mremap`` on Linux), and its pages go back to
the OS when the last view of it is dropped.

A finished column is a read-only ``memoryview`` cast to its ``array`` typecode ("d" for floats, "i" or
"q" for integers): indexing gives Python ``float``s and ``int``s, as an ``array`` does, and
``np.frombuffer(view, dtype=view.format)`` a numpy view without a copy. The view keeps its map alive.
"""

from __future__ import annotations

import mmap
from array import array
from collections.abc import Iterable
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

Typecode = Literal["d", "i", "q"]  # the column types a trace has: float64, int32, int64

_FIRST = 64 * 1024  # bytes; a map is made this large and doubles when full


def _new_map(size: int) -> mmap.mmap:
    # MAP_PRIVATE: an anonymous shared map is a fixed-size object that mremap cannot grow (past its first
    # size, writes raise SIGBUS).
    return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)


def _view(memory: mmap.mmap, typecode: Typecode, n: int) -> memoryview[Any]:
    """The first `n` items of `memory` as a read-only view of `typecode`."""
    with memoryview(memory) as whole:
        view: memoryview[Any] = whole[: n * array(typecode).itemsize].cast(typecode)
        return view.toreadonly()


class GrowingColumn:
    """An append-only column of one ``array`` typecode while a file is read; ``finish`` hands it over."""

    def __init__(self, typecode: Typecode) -> None:
        self.typecode = typecode
        self.itemsize = array(typecode).itemsize
        self._map: mmap.mmap | None = _new_map(_FIRST)
        self._len = 0
        self._one = array(typecode, [0])  # append's value, checked by the array's own conversion

    def __len__(self) -> int:
        return self._len

    def _room_for(self, n: int) -> mmap.mmap:
        if self._map is None:
            raise ValueError("the column was finished: it takes no more values")
        need, size = (self._len + n) * self.itemsize, len(self._map)
        if need > size:
            while size < need:
                size *= 2
            try:
                self._map.resize(size)
            except (OSError, SystemError):  # no mremap (macOS): copy into a larger map
                larger = _new_map(size)
                with memoryview(self._map) as old:
                    larger[: self._len * self.itemsize] = old[: self._len * self.itemsize]
                self._map.close()
                self._map = larger
        return self._map

    def extend(self, values: Iterable[Any]) -> None:
        """Append `values`; a value the typecode cannot hold raises as ``array(typecode, values)`` does,
        with nothing appended."""
        data = array(self.typecode, values)
        memory = self._room_for(len(data))
        start = self._len * self.itemsize
        memory[start : start + len(data) * self.itemsize] = data
        self._len += len(data)

    def append(self, value: Any) -> None:
        """Append one value; one the typecode cannot hold raises as ``array.append`` does."""
        one = self._one
        one[0] = value
        memory = self._room_for(1)
        start = self._len * self.itemsize
        memory[start : start + self.itemsize] = one
        self._len += 1

    def finish(self) -> memoryview[Any]:
        """The column as a read-only view (see the module docstring); it takes no more values after."""
        if self._map is None:
            raise ValueError("the column was already finished")
        view = _view(self._map, self.typecode, self._len)
        self._map = None
        return view


def empty_column(typecode: Typecode) -> memoryview[Any]:
    """A column with no values."""
    return memoryview(array(typecode)).toreadonly()


def mapped_copy(values: npt.NDArray[Any], typecode: Typecode) -> memoryview[Any]:
    """`values` converted to `typecode` (numpy's casting, unchecked: the caller knows they fit) in a map
    of their own, as a finished column."""
    n = len(values)
    memory = _new_map(max(n * array(typecode).itemsize, 1))  # a map cannot be empty
    np.frombuffer(memory, dtype=typecode, count=n)[:] = values
    return _view(memory, typecode, n)
