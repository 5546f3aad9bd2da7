"""Half-open time intervals ``(start, end)`` in µs and set algebra on sorted disjoint unions."""

from __future__ import annotations

from collections.abc import Iterable

Interval = tuple[float, float]
Union = list[Interval]


def union(intervals: Iterable[Interval]) -> Union:
    """Sorted, disjoint, non-empty intervals covering exactly the input's points."""
    out: Union = []
    for s, e in sorted(iv for iv in intervals if iv[1] > iv[0]):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def measure(u: Union) -> float:
    return sum(e - s for s, e in u)


def intersect(a: Union, b: Union) -> Union:
    out: Union = []
    i = j = 0
    while i < len(a) and j < len(b):
        s = max(a[i][0], b[j][0])
        e = min(a[i][1], b[j][1])
        if s < e:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: Union, b: Union) -> Union:
    out: Union = []
    j = 0
    for s, e in a:
        cur = s
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < e:
            out.append((cur, e))
    return out


def clip(u: Union, start: float, end: float) -> Union:
    return intersect(u, [(start, end)]) if end > start else []
