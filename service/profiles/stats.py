"""Small numeric helpers."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method); 0.0 for no values."""
    if not values:
        return 0.0
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def stable_sorted(values: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """``np.sort(values)``, through the stable argsort that the analysis uses for every sort. numpy's
    default sorts are vectorised quicksorts: their code, read into the process on first use, was a
    sizeable share of what analysing a small trace added to its memory (`docs/profiles.md`)."""
    return values[np.argsort(values, kind="stable")]


def percentile_of_array(values: npt.NDArray[np.float64], q: float) -> float:
    """``percentile(values.tolist(), q)`` without a Python float per value; ``values`` must hold no NaN
    (``sorted`` and ``numpy.sort`` order NaN differently)."""
    if not len(values):
        return 0.0
    xs = stable_sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    low, high = float(xs[lo]), float(xs[hi])
    return low + (high - low) * (pos - lo)


def sum_in_order(values: npt.NDArray[np.float64]) -> float:
    """Python's ``sum`` of floats, left to right (numpy's ``sum`` adds pairwise, which rounds differently)."""
    return 0.0 + float(np.add.accumulate(values)[-1]) if len(values) else 0.0  # 0.0 + : never -0.0, as sum


def pct(part: float, whole: float) -> float:
    return round(100 * part / whole, 2) if whole > 0 else 0.0


def std(values: Sequence[float]) -> float:
    if len(values) < 2:
        return 0.0
    m = sum(values) / len(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))
