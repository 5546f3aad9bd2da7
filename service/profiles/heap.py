"""Giving freed heap memory back to the operating system between ranks."""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)  # glibc only: not musl, not macOS
    if trim is None:
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim  # type: ignore[no-any-return]


def release_free_heap() -> bool:
    """Return the C heap's free pages to the OS (glibc's ``malloc_trim(0)``, which also releases whole
    free pages between live blocks, not only at the top). True where it ran.

    numpy arrays of a rank's size (tens of KB up) come from the C heap, and a rank's analysis leaves it
    with holes that stay resident: without this, each rank's peak is added to the fragmentation the
    earlier ranks left, and the process keeps that memory after the analysis. Costs well under a
    millisecond on an analysis's heap; a no-op where the C library has no ``malloc_trim``."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
