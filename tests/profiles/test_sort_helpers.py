"""The analysis's own sorts give numpy's answers (they only choose which sort code runs)."""

from __future__ import annotations

import numpy as np
import pytest

from service.profiles.stats import percentile, percentile_of_array, stable_sorted
from service.profiles.timeline import _unique_inverse


@pytest.mark.parametrize("size", [0, 1, 2, 7, 1000])
def test_unique_inverse_is_numpys_unique(size: int) -> None:
    values = np.random.default_rng(size).integers(-5, 20, size=size, dtype=np.int64)
    distinct, which = _unique_inverse(values)
    expected, expected_which = np.unique(values, return_inverse=True)
    assert distinct.tolist() == expected.tolist()
    assert which.tolist() == expected_which.reshape(-1).tolist()
    assert distinct[which].tolist() == values.tolist()


@pytest.mark.parametrize("size", [0, 1, 5, 1000])
def test_stable_sorted_is_numpys_sort_and_percentiles_agree(size: int) -> None:
    rng = np.random.default_rng(size)
    ints = rng.integers(-1000, 1000, size=size, dtype=np.int64)
    floats = rng.exponential(3.0, size=size).round(1)  # with repeats
    assert stable_sorted(ints).tolist() == np.sort(ints).tolist()
    assert stable_sorted(floats).tolist() == np.sort(floats).tolist()
    for q in (0, 50, 95, 100):
        assert percentile_of_array(floats, q) == percentile(floats.tolist(), q)
