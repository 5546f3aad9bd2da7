"""Collective instances per rank, their sizes and bandwidth, and cross-rank matching.

Sizes come from ``In msg nelems`` x ``dtype`` (newer PyTorch, NCCL kernels / record_param_comms) or from
the backend op's ``Input Dims`` x ``Input type`` (gloo). Bus bandwidth uses the NCCL-tests factors.
"""

from __future__ import annotations

import math
import re
import sys
from array import array
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from service.profiles.classify import COMM_BACKEND_OP, EventClass
from service.profiles.events import RankTrace
from service.profiles.models import CollectiveStats
from service.profiles.timeline import CLASSES, Timeline

_DTYPE_BYTES = {
    "float": 4,
    "float32": 4,
    "f32": 4,
    "double": 8,
    "float64": 8,
    "half": 2,
    "c10::half": 2,
    "float16": 2,
    "bfloat16": 2,
    "c10::bfloat16": 2,
    "long": 8,
    "long int": 8,
    "int64": 8,
    "int": 4,
    "int32": 4,
    "short": 2,
    "short int": 2,
    "char": 1,
    "signed char": 1,
    "unsigned char": 1,
    "byte": 1,
    "bool": 1,
    "uint8": 1,
    "int8": 1,
}


def dtype_bytes(dtype: str | None) -> int | None:
    return _DTYPE_BYTES.get(dtype.lower()) if dtype else None


def bus_factor(op: str, n: int) -> float:
    """NCCL-tests busbw / algbw factor for collective ``op`` over ``n`` ranks."""
    o = op.replace("_", "").lower()
    if n <= 1:
        return 1.0
    if o.startswith("allreduce"):
        return 2 * (n - 1) / n
    if o.startswith(("allgather", "reducescatter", "alltoall")):
        return (n - 1) / n
    return 1.0


@dataclass(slots=True)
class Instance:
    key: str
    op: str
    start: float
    dur: float
    bytes: int | None
    dtype: str | None
    group_size: int


def _norm_op(name: str) -> str:
    return re.sub(r"^(gloo|nccl|mpi|ucc|xccl|hccl):", "", name).lower()


def collect_instances(t: RankTrace, tl: Timeline, world_size: int | None) -> list[Instance]:
    """One ``Instance`` per collective execution on this rank, in start order."""
    out: list[Instance] = []
    # GPU timelines: only the events classed as communication can be collectives
    comm = CLASSES.index(EventClass.comm)
    candidates = range(len(t)) if tl.basis == "cpu_ops" else tl.item_events[tl.item_class == comm].tolist()
    for i in candidates:
        name = t.name(i)
        args = t.size_args.get(i, {})
        if tl.basis == "cpu_ops":
            if not COMM_BACKEND_OP.match(name):
                continue
            op = _norm_op(name)
            dims, types = args.get("Input Dims"), args.get("Input type")
            nbytes = None
            dtype = types[0] if isinstance(types, list) and types and isinstance(types[0], str) else None
            if isinstance(dims, list) and dims and isinstance(dims[0], list) and dtype_bytes(dtype):
                nbytes = math.prod(int(d) for d in dims[0]) * (dtype_bytes(dtype) or 0)
        else:
            op = str(args.get("Collective name") or name.split("(")[0]).lower()
            dtype = args.get("dtype") if isinstance(args.get("dtype"), str) else None
            nelems = args.get("In msg nelems")
            nbytes = (
                int(nelems) * (dtype_bytes(dtype) or 0)
                if isinstance(nelems, int) and dtype_bytes(dtype)
                else None
            )
        size = args.get("Group size")
        group = int(size) if isinstance(size, int) else (world_size or 1)
        pg = args.get("Process Group Name") or args.get("pg_name") or ""
        out.append(Instance(sys.intern(f"{pg}/{op}"), sys.intern(op), t.ts[i], t.dur[i], nbytes, dtype, group))
    out.sort(key=lambda c: c.start)
    return out


@dataclass(slots=True)
class RankCollectives:
    """What the cross-rank pass needs of one rank's collectives, as columns in start order (about
    24 bytes per collective instead of an ``Instance`` object each): the keys are interned strings."""

    keys: list[str] = field(default_factory=list)
    start: array[float] = field(default_factory=lambda: array("d"))
    dur: array[float] = field(default_factory=lambda: array("d"))

    @classmethod
    def of(cls, instances: list[Instance]) -> RankCollectives:
        return cls(
            [c.key for c in instances], array("d", [c.start for c in instances]), array("d", [c.dur for c in instances])
        )


def summarize(instances: list[Instance]) -> list[CollectiveStats]:
    groups: dict[tuple[str, str | None, int], list[Instance]] = defaultdict(list)
    for c in instances:
        groups[(c.op, c.dtype, c.group_size)].append(c)
    stats = []
    for (op, dtype, n), items in groups.items():
        total = sum(c.dur for c in items)
        sized = all(c.bytes is not None for c in items)
        nbytes = sum(c.bytes or 0 for c in items) if sized else None
        algbw = nbytes / (total * 1e3) if nbytes is not None and total > 0 else None
        stats.append(
            CollectiveStats(
                op=op,
                dtype=dtype,
                group_size=n,
                count=len(items),
                bytes=nbytes,
                total_us=round(total, 3),
                mean_us=round(total / len(items), 3),
                algbw_GBps=None if algbw is None else round(algbw, 4),
                busbw_GBps=None if algbw is None else round(algbw * bus_factor(op, n), 4),
            )
        )
    return sorted(stats, key=lambda s: -s.total_us)


@dataclass
class Matched:
    """Collectives matched across ranks: row ``k`` is one collective, column ``j`` the rank ``ranks[j]``."""

    ranks: list[int]
    start: npt.NDArray[np.float64]  # shape (matched, len(ranks))
    dur: npt.NDArray[np.float64]

    def __len__(self) -> int:
        return len(self.start)


def match_across_ranks(per_rank: dict[int, RankCollectives]) -> Matched:
    """The k-th instance of each key on every rank, for keys every rank executed; unmatched tails
    dropped. Rows are ordered by key, then k; columns follow ``per_rank``'s order."""
    positions: dict[int, dict[str, list[int]]] = {}
    for rank, cols in per_rank.items():
        keyed: dict[str, list[int]] = defaultdict(list)
        for i, key in enumerate(cols.keys):
            keyed[key].append(i)
        positions[rank] = keyed
    keys = set.intersection(*(set(k) for k in positions.values())) if positions else set()
    rows: dict[int, list[int]] = {r: [] for r in positions}
    for key in sorted(keys):
        n = min(len(positions[r][key]) for r in positions)
        for r in positions:
            rows[r].extend(positions[r][key][:n])
    del positions
    ranks = list(per_rank)
    shape = (len(rows[ranks[0]]) if ranks else 0, len(ranks))
    start, dur = np.empty(shape), np.empty(shape)
    for j, r in enumerate(ranks):
        idx = np.array(rows[r], dtype=np.intp)
        start[:, j] = np.frombuffer(per_rank[r].start, dtype=np.float64)[idx]
        dur[:, j] = np.frombuffer(per_rank[r].dur, dtype=np.float64)[idx]
    return Matched(ranks, start, dur)
