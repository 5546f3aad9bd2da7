"""The layout a plan chooses, and the rules that make a layout valid for a model on a cluster."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from functools import lru_cache

from service.planner.hardware import Cluster
from service.planner.models import ModelShape
from service.planner.problems import dims_problems
from service.spec import Checkpointing, Offload, PipelineSchedule, Sharding

SHARDING_RANK: dict[str, int] = {"ddp": 0, "zero1": 1, "zero2": 2, "zero3": 3, "fsdp": 3, "hsdp": 4}
OFFLOAD_RANK: dict[str, int] = {"none": 0, "optimizer": 1, "params": 2}
CHECKPOINT_RANK: dict[str, int] = {"none": 0, "selective": 1, "op": 2, "full": 3}


def searched_checkpointing(attention: str) -> list[Checkpointing]:
    """The checkpointing modes the search tries, by growing recompute (the search stops at the
    first that fits without more offload). Under flash attention nothing quadratic is stored, so
    `selective` equals `none` and is not tried."""
    if attention == "eager":
        return ["none", "selective", "op", "full"]
    return ["none", "op", "full"]


@dataclass(frozen=True, slots=True)
class Layout:
    """A complete parallel layout. Ranks are ordered pp (outermost), dp, cp, tp (innermost).

    `dp_shard` is how many data-parallel ranks share one copy of the model states: 1 for ddp,
    dp for ZeRO/FSDP, the intra-node part for HSDP (states are then replicated dp/dp_shard times).
    Context-parallel ranks also shard the states (as torchtitan does), so the sharding group is
    dp_shard x cp.
    """

    dp: int
    tp: int
    pp: int
    cp: int
    sharding: Sharding
    dp_shard: int
    sequence_parallel: bool
    micro_batch: int
    grad_accum_steps: int
    activation_checkpointing: Checkpointing
    pipeline_schedule: PipelineSchedule | None
    virtual_stages: int
    offload: Offload

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def shard_group(self) -> int:
        return self.dp_shard * self.cp if self.sharding != "ddp" else 1

    @property
    def replicas(self) -> int:
        """Copies of the model states across the data-parallel group."""
        return (self.dp * self.cp) // self.shard_group

    def to_dict(self) -> dict[str, object]:
        """The fields by name. Every field is a scalar, so this is `dataclasses.asdict` without its
        recursive deep copy (a submission's event carries it)."""
        return {name: getattr(self, name) for name in _LAYOUT_FIELDS}

    def short(self) -> str:
        """One line, e.g. `fsdp dp=8 tp=1 pp=1 cp=1 mb=2x4 ac=full`."""
        parts = [self.sharding, f"dp={self.dp}", f"tp={self.tp}", f"pp={self.pp}", f"cp={self.cp}"]
        if self.sharding == "hsdp":
            parts.append(f"shard={self.dp_shard}")
        if self.sequence_parallel:
            parts.append("sp")
        parts.append(f"mb={self.micro_batch}x{self.grad_accum_steps}")
        parts.append(f"ac={self.activation_checkpointing}")
        if self.pp > 1 and self.pipeline_schedule:
            sched = self.pipeline_schedule
            parts.append(f"{sched}" + (f"/v{self.virtual_stages}" if self.virtual_stages > 1 else ""))
        if self.offload != "none":
            parts.append(f"offload={self.offload}")
        return " ".join(parts)

    def simplicity(self) -> tuple[int, ...]:
        """Lower is simpler: fewer parallel dimensions, plainer sharding, less recompute and offload."""
        return (
            OFFLOAD_RANK[self.offload],
            (self.tp > 1) + (self.pp > 1) + (self.cp > 1),
            SHARDING_RANK[self.sharding],
            CHECKPOINT_RANK[self.activation_checkpointing],
            self.virtual_stages,
            self.tp * self.pp * self.cp,
        )


_LAYOUT_FIELDS = tuple(f.name for f in fields(Layout))


def mesh_problems(shape: ModelShape, cluster: Cluster, global_batch: int, dp: int, tp: int, pp: int,
                  cp: int, attention: str) -> list[tuple[str, str]]:
    """Why (dp, tp, pp, cp) cannot run this model on this cluster: (field, message) pairs, empty if valid."""
    problems: list[tuple[str, str]] = []
    world = cluster.world_size
    if problem := product_problem({"dp": dp, "tp": tp, "pp": pp, "cp": cp}, world):
        problems.append(("dp", problem))
    problems += [(p.field, p.message) for p in dims_problems(shape, tp=tp, pp=pp, cp=cp)]
    if cp > 1 and attention == "eager":
        problems.append(("cp", "context parallelism needs flash attention (training.attention: flash)"))
    if global_batch % dp:
        problems.append(("dp", f"training.global_batch ({global_batch}) must be divisible by dp ({dp})"))
    return problems


def product_problem(degrees: Mapping[str, int], world: int) -> str | None:
    """What is wrong with the product of some parallel degrees (dp, tp, pp, cp, in that order), or None.

    All four must multiply to the GPU count; fewer must multiply to a divisor of it, which leaves
    the unset degrees a whole number of GPUs. The message names the degrees and the fix.
    """
    product = math.prod(degrees.values())
    names = list(degrees)
    if (product == world) if len(names) == 4 else (world % product == 0):
        return None  # the common case in the search's mesh loop: no message to build
    named = "*".join(names)
    stated = f"{named} = {'*'.join(str(v) for v in degrees.values())} = {product}"
    if len(names) == 4:
        rest = product // degrees["dp"]
        fix = f"set dp={world // rest}, or give the job {product} GPUs" if world % rest == 0 else (
            f"change the pins so that they multiply to {world}, or give the job {product} GPUs")
        return f"{stated}, but the resources give {world} GPUs; the product must equal the GPU count: {fix}"
    either = ", ".join(names[:-1]) + f" or {names[-1]}"
    wrong, fix = ("is more than", "lower") if product > world else ("does not divide", "change")
    return (f"{stated} {wrong} the {world} GPUs of the resources; {fix} {either} so that {named}"
            f" divides {world}, or give the job a multiple of {product} GPUs")


def divisors(n: int) -> list[int]:
    """Every positive divisor of `n` (>= 1), ascending, built from its prime factors.

    Trial division up to sqrt(n) would take 2**31 steps for a global batch of 2**62 (the spec bounds
    the inputs far lower, but the planner does not rely on that): factorising costs microseconds for
    any 64-bit `n` and for larger ones whose factors are small."""
    return list(_divisors(n))


@lru_cache(maxsize=4096)
def _divisors(n: int) -> tuple[int, ...]:
    if n < 1:
        raise ValueError(f"divisors of {n}: n must be a positive integer")
    out = [1]
    for p, e in sorted(prime_factors(n).items()):
        out = [d * p**k for d in out for k in range(e + 1)]
    return tuple(sorted(out))


_SMALL_PRIMES = tuple(p for p in range(2, 1000) if all(p % q for q in range(2, math.isqrt(p) + 1)))
# Miller-Rabin with these bases is exact below 3.3e24 (and a strong probable-prime test above).
_WITNESSES = _SMALL_PRIMES[:13]


def prime_factors(n: int) -> dict[int, int]:
    """{prime: exponent} of `n` >= 1: trial division by the primes below 1000, then Pollard's rho."""
    factors: dict[int, int] = {}
    for p in _SMALL_PRIMES:
        if p * p > n:
            break
        while n % p == 0:
            factors[p] = factors.get(p, 0) + 1
            n //= p
    pending = [n] if n > 1 else []
    while pending:
        m = pending.pop()
        if _is_prime(m):
            factors[m] = factors.get(m, 0) + 1
            continue
        d = _rho(m)
        pending += [d, m // d]
    return factors


def _is_prime(n: int) -> bool:
    if n < 2:
        return False
    for p in _WITNESSES:
        if n % p == 0:
            return n == p
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for a in _WITNESSES:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def _rho(n: int) -> int:
    """A non-trivial factor of the odd composite `n` (Pollard's rho, Brent's variant)."""
    for c in range(1, n):
        y, m, g, r, q = 2, 128, 1, 1, 1
        x = ys = y
        while g == 1:
            x = y
            for _ in range(r):
                y = (y * y + c) % n
            k = 0
            while k < r and g == 1:
                ys = y
                for _ in range(min(m, r - k)):
                    y = (y * y + c) % n
                    q = q * abs(x - y) % n
                g = math.gcd(q, n)
                k += m
            r *= 2
        if g == n:
            g = 1
            while g == 1:
                ys = (ys * ys + c) % n
                g = math.gcd(abs(x - ys), n)
        if g != n:
            return g
    raise ArithmeticError(f"no factor found for {n}")  # unreachable for a composite n
