"""The search's time budget, and divisors of large numbers (the search enumerates divisors of the GPU
count and of the batch: trial division up to sqrt(n) never ended for a global batch of 2**62)."""

from __future__ import annotations

import math
import time

import pytest

from service.planner import Deadline, SearchBudgetExceeded, plan
from service.planner.layout import divisors, prime_factors
from service.planner.search import resolve, search, smallest_fitting_world
from tests.conftest import make_spec


def _brute(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def test_divisors_agree_with_trial_division_on_small_numbers() -> None:
    for n in range(1, 2000):
        assert divisors(n) == _brute(n), n
    assert len(divisors(720720)) == 240 and divisors(720720) == _brute(720720)


@pytest.mark.parametrize(("n", "count"), [
    (10**400, 401 * 401),  # float(n) overflows: n**0.5 was an OverflowError (a 500); too many to list
    (2**62, 63),  # sqrt(n) is 2**31: trial division never returned
    (2**24 * 3**10 * 5**5, 25 * 11 * 6),
    ((2**61 - 1) * (2**31 - 1), 4),  # two large primes: found by Pollard's rho
    (2**89 - 1, 2),  # a Mersenne prime past 64 bits
    (1_000_000_007 * 998_244_353, 4),
])
def test_divisors_of_large_numbers(n: int, count: int) -> None:
    found = divisors(n) if count < 10_000 else None
    factors = prime_factors(n)
    assert math.prod(p**e for p, e in factors.items()) == n
    assert math.prod(e + 1 for e in factors.values()) == count
    if found is not None:
        assert len(found) == count and found == sorted(set(found))
        assert found[0] == 1 and found[-1] == n and all(n % d == 0 for d in found)


def test_prime_factors_of_huge_powers() -> None:
    assert prime_factors(10**400) == {2: 400, 5: 400}
    assert prime_factors(2**62) == {2: 62}
    assert prime_factors(1) == {}


def test_divisors_need_a_positive_number() -> None:
    for n in (0, -1, -(2**62)):
        with pytest.raises(ValueError, match="positive"):
            divisors(n)


def test_an_expired_deadline_stops_the_search_with_its_budget() -> None:
    spec = make_spec()
    expired = Deadline(budget_s=0.25, at=time.monotonic() - 1)
    with pytest.raises(SearchBudgetExceeded) as info:
        plan(spec, deadline=expired)
    assert info.value.budget_s == 0.25 and "0.25 s budget" in str(info.value)


class CountingDeadline:
    """A deadline that passes after `checks` checks: the search must check it as it goes."""

    def __init__(self, checks: int) -> None:
        self.checks, self.seen = checks, 0

    def check(self, evaluated: int = 0) -> None:
        self.seen += 1
        if self.seen > self.checks:
            raise SearchBudgetExceeded(1.0, evaluated)


def test_the_search_checks_its_deadline_inside_the_loops() -> None:
    ctx = resolve(make_spec(resources={"nodes": 8}))
    never = CountingDeadline(10**9)
    full = search(ctx, deadline=never)  # type: ignore[arg-type]
    assert full.best is not None and never.seen > 10
    # Stopped half-way: it raises (rather than return a partial answer) and says how far it got.
    with pytest.raises(SearchBudgetExceeded) as info:
        search(ctx, deadline=CountingDeadline(never.seen // 2))  # type: ignore[arg-type]
    assert 0 < info.value.evaluated < full.evaluated


def test_the_search_for_the_smallest_gpu_count_keeps_to_the_deadline() -> None:
    ctx = resolve(make_spec(model={"preset": "llama-3.1-405b"}, resources={"nodes": 1}))
    assert search(ctx).best is None  # nothing fits: plan() goes on to look for a GPU count that fits
    with pytest.raises(SearchBudgetExceeded):
        smallest_fitting_world(ctx, Deadline(budget_s=1.0, at=time.monotonic() - 1))
    with pytest.raises(SearchBudgetExceeded):
        plan(ctx.spec, deadline=CountingDeadline(3))  # type: ignore[arg-type]


def test_a_deadline_that_is_not_reached_changes_nothing() -> None:
    spec = make_spec(resources={"nodes": 2})
    assert plan(spec, deadline=Deadline.after(3600)).model_dump() == plan(spec).model_dump()
