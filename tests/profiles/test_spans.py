"""``Spans`` (a union as two float arrays) answers what the list form (``intervals``) answers, value
for value: the analysis mixes both, and every summary must come out the same whichever is used."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from service.profiles.intervals import Spans, Union, clip, intersect, measure, subtract, union, union_of_arrays

# small integer endpoints make touching and overlapping intervals common; halves make float ones
_point = st.integers(0, 60).map(lambda v: v / 2)
_intervals = st.lists(st.tuples(_point, _point), max_size=25)


def _spans(raw: list[tuple[float, float]]) -> tuple[Union, Spans]:
    u = union(raw)
    return u, Spans.of(u)


@given(_intervals)
def test_union_of_arrays_is_the_list_union(raw: list[tuple[float, float]]) -> None:
    starts = np.array([s for s, _ in raw], dtype=np.float64)
    ends = np.array([e for _, e in raw], dtype=np.float64)
    assert union_of_arrays(starts, ends).union() == union(raw)


@given(_intervals, _intervals)
def test_within_is_intersect(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> None:
    u, spans = _spans(a)
    other, other_spans = _spans(b)
    expected = intersect(u, other)
    assert spans.within(other).union() == expected
    assert spans.within(other_spans).union() == expected


def test_within_keeps_each_piece_in_the_order_of_the_other_union() -> None:
    spans = Spans.of([(0.0, 10.0), (20.0, 30.0)])
    pieces = spans.within([(5.0, 25.0), (28.0, 40.0)])
    assert pieces.union() == [(5.0, 10.0), (20.0, 25.0), (28.0, 30.0)]
    # intervals that only touch share no time: no empty pieces
    assert spans.within([(10.0, 20.0), (30.0, 35.0)]).union() == []
    assert spans.within([(-5.0, 0.0), (10.0, 21.0)]).union() == [(20.0, 21.0)]
    assert spans.within([]).union() == []
    assert Spans.of([]).within([(0.0, 1.0)]).union() == []


@given(_intervals, _point, _point)
def test_clip_and_measure_are_the_list_forms(raw: list[tuple[float, float]], start: float, end: float) -> None:
    u, spans = _spans(raw)
    assert spans.clip(start, end) == clip(u, start, end)
    assert spans.measure() == measure(u)


@given(_intervals, _intervals)
def test_subtract_from_is_subtract(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> None:
    u, spans = _spans(a)
    other = union(b)
    expected = subtract(other, u)
    assert spans.subtract_from(other).union() == expected
    assert spans.subtract_from(Spans.of(other)).union() == expected


def test_subtract_from_leaves_nothing_where_intervals_only_touch() -> None:
    touching = Spans.of([(0.0, 5.0), (5.0, 10.0)])  # as `within` may give, pieces of two windows
    assert touching.gaps().union() == [(-float("inf"), 0.0), (10.0, float("inf"))]
    assert touching.subtract_from([(3.0, 8.0)]).union() == []
    assert touching.subtract_from([(-2.0, 12.0)]).union() == [(-2.0, 0.0), (10.0, 12.0)]
    assert Spans.of([]).subtract_from([(1.0, 2.0)]).union() == [(1.0, 2.0)]
