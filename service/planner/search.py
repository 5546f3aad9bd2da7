"""Search every runnable layout, evaluate each, pick the best that fits.

`plan(spec)` searches whatever the spec leaves unpinned; `estimate(spec, layout)` evaluates one
complete layout, fitting or not. Both return a `Plan`.

Only layouts without a structural problem (`service.planner.runnable`, the rules the runtime
applies too) are built. Ranking, risk-aware (`choose`):

1. tiers: a layout the runtime implements beats one that needs a runtime gap (offload, cp, fp8),
   and within each, a layout that leaves at least `Context.min_free` of the GPU's memory free
   (default 10%) beats one that does not; a tier is left only when nothing in it fits;
2. within the best tier, the fastest step time; but every layout within `SIMPLER_WITHIN` (3%) of
   it is a near-tie, and the simplest near-tie wins (`Layout.simplicity`: no offload, fewer
   parallel dimensions, DDP before ZeRO before FSDP, less recompute), then the faster, then the
   one using less memory.

Variants that are slower by construction are skipped and counted as `dominated`: more offload or
more recompute than a variant of the same layout that already fits leaving `Context.min_free`
free (one that fits without that room does not dominate: more recompute or offload may buy it),
GPipe next to 1F1B (same bubble, more memory), and sequence parallelism off next to on (same
traffic, more memory).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from service.planner.budget import Deadline
from service.planner.errors import FieldProblem, InvalidSpec
from service.planner.hardware import Cluster, resolve_cluster
from service.planner.layout import (
    OFFLOAD_RANK,
    Layout,
    divisors,
    mesh_problems,
    product_problem,
    searched_checkpointing,
)
from service.planner.memory import (
    ActivationMemory,
    Memory,
    StaticMemory,
    activation_memory,
    combine,
    combined_total,
    memory,
    static_memory,
)
from service.planner.models import ModelShape, resolve_model
from service.planner.runnable import (
    has_gap,
    offload_problems,
    schedule_problems,
    sharding_problems,
)
from service.planner.timing import ForwardTimes, StepTime, forward_times, step_time
from service.spec import (
    Checkpointing,
    LayoutPins,
    Offload,
    Optimizer,
    PipelineSchedule,
    Precision,
    Sharding,
    TrainingSpec,
)

TIME_BUCKET = math.log(1.002)
MAX_ALTERNATIVES = 5
MAX_WORLD_FOR_FIT_SEARCH = 1 << 17
# Fitting layouts whose compute, recompute and bubble alone exceed this multiple of the best step
# time so far are not timed further: they can be neither the choice nor a useful runner-up.
PRUNE_FACTOR = 1.25
DIMENSIONS = ("tp", "pp", "cp", "sharding", "activation_checkpointing", "offload")
# The least share of a GPU's memory a preferred layout leaves free (variable shapes, fragmentation).
DEFAULT_MIN_FREE_FRACTION = 0.10
# Layouts within this fraction of the fastest step time are near-ties: the simplest of them wins.
SIMPLER_WITHIN = 0.03


@dataclass(frozen=True, slots=True)
class Context:
    """A spec resolved against the presets and the catalog."""

    spec: TrainingSpec
    shape: ModelShape
    cluster: Cluster
    min_free: float = DEFAULT_MIN_FREE_FRACTION
    limit: int = 0
    roomy: float = 0.0  # the most bytes a layout may use and still leave `min_free` of the GPU free

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_free < 1.0:
            raise InvalidSpec([FieldProblem(loc=("min_free_fraction",), message=(
                f"min_free_fraction={self.min_free} must be at least 0 and below 1 (e.g. 0.1 for 10%)"))])
        object.__setattr__(self, "limit", self.cluster.memory_bytes_per_gpu)
        object.__setattr__(self, "roomy", (1.0 - self.min_free) * self.limit)

    def tier(self, layout: Layout, total: float) -> int:
        """0 runnable with room, 1 runnable but under `min_free`, 2 and 3 the same with a runtime gap."""
        return 2 * has_gap(layout, self.precision) + (total > self.roomy)

    @property
    def precision(self) -> Precision:
        return self.spec.training.precision

    @property
    def optimizer(self) -> Optimizer:
        return self.spec.training.optimizer

    @property
    def attention(self) -> str:
        return self.spec.training.attention

    @property
    def global_batch(self) -> int:
        return self.spec.training.global_batch


class Mesh(NamedTuple):
    """The four parallel degrees; their product is the GPU count."""

    dp: int
    tp: int
    pp: int
    cp: int


class Base(NamedTuple):
    """The fields of a layout that the outer loops of the search fix; `layout()` adds the rest."""

    mesh: Mesh
    sharding: Sharding
    dp_shard: int
    sequence_parallel: bool

    def layout(self, *, micro_batch: int = 1, grad_accum_steps: int = 1,
               activation_checkpointing: Checkpointing = "none", pipeline_schedule: PipelineSchedule | None = None,
               virtual_stages: int = 1, offload: Offload = "none") -> Layout:
        """The complete layout. The search builds tens of thousands, so `Layout` is called with its
        fields in declaration order, each named by its local: keywords through a class call cost a
        dict per call (about 0.7 us, 5% of a search). tests/planner/test_search.py checks the order."""
        (dp, tp, pp, cp), sharding, dp_shard, sequence_parallel = self
        return Layout(dp, tp, pp, cp, sharding, dp_shard, sequence_parallel, micro_batch, grad_accum_steps,
                      activation_checkpointing, pipeline_schedule, virtual_stages, offload)


@dataclass(slots=True)
class Candidate:
    """One evaluated layout. The memory breakdown is built on first use from its two halves."""

    layout: Layout
    fits: bool
    total: float
    parts: tuple[StaticMemory, ActivationMemory] | None = None
    time: StepTime | None = None
    built: Memory | None = None
    tier: int = 0
    _key: tuple[int, int, float, tuple[int, ...]] | None = None

    @classmethod
    def of(cls, layout: Layout, mem: Memory, fits: bool) -> Candidate:
        return cls(layout=layout, fits=fits, total=mem.total, built=mem)

    @property
    def mem(self) -> Memory:
        if self.built is None:
            assert self.parts is not None
            self.built = combine(*self.parts, self.layout.pp)
        return self.built

    @property
    def step_s(self) -> float:
        assert self.time is not None
        return self.time.step_s

    def key(self) -> tuple[int, int, float, tuple[int, ...]]:
        """Tier, then step time in 0.2% buckets, then memory, then simplicity: the order of the
        runners-up. The choice itself adds the near-tie rule (`choose`)."""
        if self._key is None:
            self._key = (self.tier, round(math.log(self.step_s) / TIME_BUCKET), self.total,
                         self.layout.simplicity())
        return self._key


@dataclass(slots=True)
class SearchResult:
    best: Candidate | None = None
    closest: Candidate | None = None
    closest_ratio: float = math.inf
    by_signature: dict[tuple[object, ...], Candidate] = field(default_factory=dict)
    by_dimension: dict[tuple[str, object], Candidate] = field(default_factory=dict)
    invalid: int = 0
    out_of_memory: int = 0
    dominated: int = 0
    fitting: int = 0
    pruned: int = 0  # skipped whole at one micro-batch: compute alone is too slow (never fit-checked)
    pruned_dimensions: set[tuple[str, object]] = field(default_factory=set)
    # (dimension, value) of layouts left untimed because they need a runtime gap while a layout the
    # runtime runs already fits (they cannot be chosen).
    gap_dimensions: set[tuple[str, object]] = field(default_factory=set)
    evaluated: int = 0
    invalid_reasons: dict[str, int] = field(default_factory=dict)
    timed: list[Candidate] = field(default_factory=list)  # every fitting layout that was timed
    fastest: Candidate | None = None  # the fastest of the chosen's tier (the chosen, unless simplicity decided)
    decided_by: list[str] = field(default_factory=list)  # "headroom", "simplicity", "gap"

    def prunes(self) -> bool:
        """Whether `best` may bound the search: only a tier-0 best (nothing in a later tier can win)."""
        return self.best is not None and self.best.tier == 0

    def invalid_because(self, reason: str, count: int = 1) -> None:
        self.invalid += count
        self.invalid_reasons[reason] = self.invalid_reasons.get(reason, 0) + count


def resolve(spec: TrainingSpec) -> Context:
    """Resolve presets and the GPU; check pins against the model and the cluster (InvalidSpec)."""
    problems: list[FieldProblem] = []
    shape = cluster = None
    try:
        shape = resolve_model(spec.model)
    except InvalidSpec as exc:
        problems += exc.problems
    try:
        cluster = resolve_cluster(spec.resources)
    except InvalidSpec as exc:
        problems += exc.problems
    if shape is None or cluster is None:
        raise InvalidSpec(problems)
    precision = spec.training.precision
    if not cluster.gpu.supports(precision):
        problems.append(FieldProblem(
            loc=("training", "precision"),
            message=f"{cluster.gpu.name} has no {precision} support; use one of"
            f" {', '.join(sorted(cluster.gpu.peak_tflops))}"))
    problems += _pin_problems(spec.layout, shape, cluster, spec.training.global_batch, spec.training.attention)
    if problems:
        raise InvalidSpec(problems)
    return Context(spec=spec, shape=shape, cluster=cluster)


def runnable_pin_problems(pins: LayoutPins, precision: str) -> list[FieldProblem]:
    """Pinned combinations the runtime cannot apply (`runnable`, the runtime's own rules): `plan`
    refuses them; `estimate` still evaluates such a layout (a published run, a what-if) and warns."""
    pinned = sharding_problems(
        tp=pins.tp or 1, pp=pins.pp or 1, sharding=pins.sharding or "fsdp", dp=1, dp_shard=1,
        sequence_parallel=bool(pins.sequence_parallel) and pins.tp is not None, precision=precision, cp=1,
        attention="flash")
    if pins.sharding is not None:
        pinned += offload_problems(sharding=pins.sharding, offload=pins.offload or "none")
    return [FieldProblem(loc=("layout", p.field), message=p.message) for p in pinned]


def _pin_problems(pins: LayoutPins, shape: ModelShape, cluster: Cluster, batch: int,
                  attention: str) -> list[FieldProblem]:
    world = cluster.world_size
    out: list[FieldProblem] = []

    def bad(name: str, message: str) -> None:
        out.append(FieldProblem(loc=("layout", name), message=message))

    degrees: dict[str, int] = {}
    for name in ("dp", "tp", "pp", "cp"):
        value = getattr(pins, name)
        if value is None:
            continue
        degrees[name] = value
        if world % value:
            bad(name, f"{name}={value} must divide the {world} GPUs of the resources; use one of"
                      f" {', '.join(str(d) for d in divisors(world))}, or change the GPU count")
    if pins.tp is not None and (shape.heads % pins.tp or shape.kv_heads % pins.tp or shape.ffn_hidden % pins.tp):
        bad("tp", f"tp={pins.tp} must divide heads ({shape.heads}), kv_heads ({shape.kv_heads}) and"
                  f" ffn_hidden ({shape.ffn_hidden}); allowed: "
                  + ", ".join(str(d) for d in divisors(world) if _tp_ok(shape, d)))
    if pins.pp is not None and pins.pp > shape.layers:
        bad("pp", f"pp={pins.pp} exceeds the model's {shape.layers} layers")
    if pins.cp is not None and pins.cp > 1:
        if shape.seq_len % (2 * pins.cp):
            bad("cp", f"cp={pins.cp} needs seq_len ({shape.seq_len}) divisible by 2*cp")
        if attention == "eager":
            bad("cp", "context parallelism needs training.attention: flash")
    # Pins that each divide the GPU count can still multiply past it (tp=8, pp=8 on 8 GPUs). All four
    # pinned must multiply to it exactly, and dp is the one to change; fewer are at fault together.
    each_divides = not any(world % v for v in degrees.values())
    if len(degrees) == 4 or (len(degrees) > 1 and each_divides):
        problem = product_problem(degrees, world)
        if problem:
            out.append(FieldProblem(loc=("layout", "dp") if len(degrees) == 4 else ("layout",), message=problem))
    if pins.dp is not None and batch % pins.dp:
        bad("dp", f"training.global_batch ({batch}) must be divisible by dp ({pins.dp})")
    if pins.micro_batch is not None:
        if batch % pins.micro_batch:
            bad("micro_batch", f"training.global_batch ({batch}) must be divisible by micro_batch"
                               f" ({pins.micro_batch})")
        elif pins.dp is not None and batch % (pins.dp * pins.micro_batch):
            bad("micro_batch", f"training.global_batch ({batch}) must be divisible by dp*micro_batch"
                               f" ({pins.dp}*{pins.micro_batch})")
    if pins.virtual_stages is not None and pins.virtual_stages > 1 and pins.pp is not None:
        if pins.pp == 1:
            bad("virtual_stages", "virtual_stages > 1 needs pp > 1")
        elif pins.pp * pins.virtual_stages > shape.layers:
            bad("virtual_stages", f"pp*virtual_stages ({pins.pp}*{pins.virtual_stages}) exceeds the"
                                  f" model's {shape.layers} layers")
    if pins.sharding == "hsdp" and cluster.nodes < 2 and pins.dp_shard is None:
        bad("sharding", "hsdp replicates across nodes: it needs more than one node (or set dp_shard)")
    return out


def _tp_ok(shape: ModelShape, tp: int) -> bool:
    return not (shape.heads % tp or shape.kv_heads % tp or shape.ffn_hidden % tp)


def _meshes(ctx: Context, pins: LayoutPins, result: SearchResult, deadline: Deadline | None) -> Iterator[Mesh]:
    """Every valid mesh under the pins (invalid ones are counted in `result`): those without context
    parallelism first, then those with it. The runtime does not run cp yet, so once a layout it
    runs fits, the search skips every cp mesh without building it (about half of a 1T search)."""
    world = ctx.cluster.world_size
    for context_parallel in (False, True):
        yield from _meshes_of(ctx, pins, result, deadline, world, context_parallel)


def _meshes_of(ctx: Context, pins: LayoutPins, result: SearchResult, deadline: Deadline | None, world: int,
               context_parallel: bool) -> Iterator[Mesh]:
    for tp in divisors(world):
        if pins.tp is not None and tp != pins.tp:
            continue
        for cp in divisors(world // tp):
            if (pins.cp is not None and cp != pins.cp) or (cp > 1) != context_parallel:
                continue
            for pp in divisors(world // (tp * cp)):
                if pins.pp is not None and pp != pins.pp:
                    continue
                dp = world // (tp * cp * pp)
                if pins.dp is not None and dp != pins.dp:
                    continue
                if deadline is not None:
                    deadline.check(result.evaluated)
                problems = mesh_problems(ctx.shape, ctx.cluster, ctx.global_batch, dp, tp, pp, cp, ctx.attention)
                if problems:
                    result.invalid += 1
                    reason = problems[0][1].split(" must ")[0].split(" needs ")[0]
                    result.invalid_reasons[reason] = result.invalid_reasons.get(reason, 0) + 1
                    continue
                yield Mesh(dp=dp, tp=tp, pp=pp, cp=cp)


def _shardings(ctx: Context, pins: LayoutPins, mesh: Mesh, result: SearchResult) -> list[tuple[Sharding, int]]:
    """(sharding, dp_shard) options for a mesh that the runtime can apply (`runnable.sharding_problems`).

    On a single data-parallel rank every sharding is DDP, except that FSDP is kept as the carrier of
    `offload=params` (70B on one GPU); `_offloads` then gives it nothing else.
    """
    dp, tp, pp, cp = mesh
    names: list[Sharding]
    if pins.sharding is not None:
        names = [pins.sharding]
    elif dp * cp == 1:
        if tp > 1:
            names = ["fsdp"]  # DDP does not take tensor-parallel parameters; FSDP2 on one rank wraps nothing
        elif pins.offload in (None, "params"):
            names = ["ddp", "fsdp"]  # FSDP as the carrier of offload=params
        else:
            names = ["ddp"]
    else:
        names = ["ddp", "zero1", "zero2", "fsdp", "hsdp"]
    out: list[tuple[Sharding, int]] = []
    reason = ""
    for name in names:
        if name == "ddp":
            shard = 1
        elif name != "hsdp":
            shard = dp
        else:
            shard = pins.dp_shard or ctx.cluster.gpus_per_node // (tp * cp)
            if not (2 <= shard < dp and dp % shard == 0):
                continue
        problems = sharding_problems(tp=tp, pp=pp, sharding=name, dp=dp, dp_shard=shard,
                                     sequence_parallel=False, precision=ctx.precision, cp=cp,
                                     attention=ctx.attention)
        if problems:
            reason = problems[0].message.split(";")[0]
            continue
        out.append((name, shard))
    if not out:
        result.invalid_because(reason or "no sharding applies")
    return out


def _schedules(ctx: Context, pins: LayoutPins, pp: int, m: int) -> list[tuple[PipelineSchedule | None, int]]:
    """(pipeline_schedule, virtual_stages) options for `pp` stages and `m` micro-batches."""
    if pp == 1:
        return [(None, 1)]
    if m < pp:
        return []
    names: list[PipelineSchedule] = [pins.pipeline_schedule] if pins.pipeline_schedule else ["1f1b", "interleaved"]
    out: list[tuple[PipelineSchedule | None, int]] = []
    for name in names:
        if name != "interleaved":
            out.append((name, 1))
            continue
        if m % pp:
            continue
        chunks = [pins.virtual_stages] if pins.virtual_stages else [2, 4]
        out += [(name, v) for v in chunks if v > 1 and pp * v <= ctx.shape.layers]
    return [(name, v) for name, v in out if not schedule_problems(
        pp=pp, pipeline_schedule=name, virtual_stages=v, grad_accum_steps=m, layers=ctx.shape.layers)]


def _fits(ctx: Context, mem: Memory) -> bool:
    if mem.total > ctx.limit:
        return False
    return not mem.cpu_per_node or mem.cpu_per_node <= ctx.cluster.cpu_memory_gib * 2**30


def _evaluate(ctx: Context, layout: Layout) -> Candidate:
    mem = memory(ctx.shape, ctx.cluster, layout, precision=ctx.precision, optimizer=ctx.optimizer,
                 attention=ctx.attention)
    cand = Candidate.of(layout, mem, _fits(ctx, mem))
    cand.tier = ctx.tier(layout, mem.total)
    cand.time = step_time(ctx.shape, ctx.cluster, layout, precision=ctx.precision,
                          optimizer=ctx.optimizer, attention=ctx.attention)
    return cand


def _offloads(pins: LayoutPins, sharding: Sharding, carrier: bool) -> list[Offload]:
    """Offload options, least offload first: wherever offload can help, a single GPU included.
    A `carrier` (FSDP on one rank beside DDP, see `_shardings`) only carries `offload=params`."""
    if pins.offload:
        options: list[Offload] = [pins.offload]
    elif carrier:
        options = ["params"]
    else:
        options = ["none", "optimizer", "params"]
    return [o for o in options if not offload_problems(sharding=sharding, offload=o)]


def search(ctx: Context, pins: LayoutPins | None = None, *, timed: bool = True,
           stop_at_first_fit: bool = False, deadline: Deadline | None = None) -> SearchResult:
    """Enumerate and evaluate every valid layout under `pins` (default: the spec's).

    Memory is evaluated for every candidate that is not skipped by a bound; time only for those
    that fit. Bounds, all exact: model states alone over the limit (no micro-batch fits); the
    most offload at a checkpointing level does not fit (no less offload does); a micro-batch with
    nothing fitting (no larger one fits, except under GPipe).

    The loops, outermost first: mesh (those without context parallelism first, see `_meshes`),
    sharding, sequence parallelism (together a `Base`), then micro-batch, pipeline schedule,
    activation checkpointing and offload.

    With a `deadline`, the search checks the clock once per mesh and once per micro-batch (a few
    dozen layouts apart) and raises `SearchBudgetExceeded` once it has passed.
    """
    pins = pins if pins is not None else ctx.spec.layout
    result = SearchResult()
    batch = ctx.global_batch
    limit = ctx.limit
    host_limit = ctx.cluster.cpu_memory_gib * 2**30
    forwards: dict[tuple[int, ...], ForwardTimes] = {}
    activations: dict[tuple[object, ...], ActivationMemory] = {}
    schedule_options: dict[tuple[int, int], list[tuple[PipelineSchedule | None, int]]] = {}
    shape, cluster = ctx.shape, ctx.cluster
    precision, optimizer, attention = ctx.precision, ctx.optimizer, ctx.attention
    roomy = ctx.roomy  # `Context.tier`, inlined in the hot loop

    def schedules_for(pp: int, m: int) -> list[tuple[PipelineSchedule | None, int]]:
        options = schedule_options.get((pp, m))
        if options is None:
            options = schedule_options[pp, m] = _schedules(ctx, pins, pp, m)
        return options

    ckpt_pin = pins.activation_checkpointing or ctx.spec.checkpointing_pin
    ckpts: list[Checkpointing] = [ckpt_pin] if ckpt_pin else searched_checkpointing(ctx.attention)
    for mesh in _meshes(ctx, pins, result, deadline):
        dp, tp, pp, cp = mesh
        sp_options = [pins.sequence_parallel] if pins.sequence_parallel is not None else [tp > 1]
        per_replica = batch // dp
        mbs = [b for b in divisors(per_replica) if pins.micro_batch in (None, b)]
        if not mbs:
            result.invalid += 1
            continue
        if cp > 1 and result.best is not None and result.best.tier <= 1:
            # A layout the runtime runs already fits: none needing context parallelism can win.
            result.gap_dimensions.add(("cp", cp))
            result.dominated += len(mbs) * len(ckpts)
            continue
        fitting_before_mesh = result.fitting
        for sharding, dp_shard in _shardings(ctx, pins, mesh, result):
            carrier = dp * cp == 1 and tp == 1 and sharding == "fsdp" and pins.sharding is None
            if carrier and result.fitting > fitting_before_mesh and not pins.offload:
                # DDP already fits on this single rank: offload=params cannot be preferred to it.
                result.dominated += len(mbs) * len(ckpts)
                continue
            for sp in sp_options:
                if sp and tp == 1:
                    continue
                base = Base(mesh=mesh, sharding=sharding, dp_shard=dp_shard, sequence_parallel=sp)
                # Model states per offload option; those that alone exceed the GPU or the host are left out.
                statics: dict[Offload, StaticMemory] = {}
                for off in _offloads(pins, sharding, carrier):
                    static = static_memory(shape, cluster, base.layout(offload=off), precision=precision,
                                           optimizer=optimizer)
                    result.evaluated += 1
                    floor = static.floor
                    if floor <= limit and max(static.cpu_per_node_first, static.cpu_per_node_last) <= host_limit:
                        statics[off] = static
                        continue
                    # States alone exceed the GPU (or the host): no micro-batch fits.
                    result.out_of_memory += len(mbs) * len(ckpts)
                    if not result.fitting and floor / limit < result.closest_ratio:
                        b, m = mbs[0], per_replica // mbs[0]
                        for schedule, v in schedules_for(pp, m)[:1]:
                            lean = base.layout(micro_batch=b, grad_accum_steps=m, activation_checkpointing=ckpts[-1],
                                               pipeline_schedule=schedule, virtual_stages=v, offload=off)
                            lean_acts = activation_memory(shape, lean, precision=precision, attention=attention)
                            _track_closest(ctx, result, static, lean_acts, lean)
                if not statics:
                    continue
                offs = list(statics)
                thrift = statics[offs[-1]]  # the most offload: if it does not fit, nothing does
                for b in mbs:
                    if deadline is not None:
                        deadline.check(result.evaluated)
                    m = per_replica // b
                    schedules = schedules_for(pp, m)
                    if not schedules:
                        result.invalid += 1
                        continue
                    fwd: ForwardTimes | None = None  # looked up once per micro-batch, when first needed
                    if timed and result.prunes():
                        assert result.best is not None
                        fwd = _forward(ctx, forwards, base, b)
                        least_bubble = (pp - 1) / max(v for _, v in schedules) if pp > 1 else 0.0
                        floor = (m + least_bubble) * 3 * (fwd.layers * fwd.layer_f + fwd.head_f)
                        if floor > PRUNE_FACTOR * result.best.step_s:
                            # Compute alone is too slow for every variant at this micro-batch.
                            result.pruned += len(schedules) * len(ckpts) * len(offs)
                            for dim, value in zip(DIMENSIONS[:4], (tp, pp, cp, sharding), strict=True):
                                result.pruned_dimensions.add((dim, value))
                            continue
                    any_fit_at_b = False
                    for schedule, v in schedules:
                        # Checkpointing only grows in this loop and offload in the one inside it, so a variant
                        # is dominated once a variant with no more offload has fitted at this schedule leaving
                        # `min_free` free: it is as fast or faster and in as good a tier. One that fits without
                        # that room does not dominate: more recompute or offload may buy the headroom.
                        least_fitted_offload = len(OFFLOAD_RANK)
                        for ckpt in ckpts:
                            akey = (tp, cp, pp, sp, b, m, schedule, v, ckpt)
                            acts = activations.get(akey)
                            if acts is None:
                                shape_only = base.layout(micro_batch=b, grad_accum_steps=m,
                                                         activation_checkpointing=ckpt, pipeline_schedule=schedule,
                                                         virtual_stages=v)
                                acts = activations[akey] = activation_memory(
                                    shape, shape_only, precision=precision, attention=attention)
                            if combined_total(thrift, acts, pp) > limit:
                                result.evaluated += 1
                                result.out_of_memory += len(offs)
                                if not result.fitting:
                                    _track_closest(ctx, result, thrift, acts, base.layout(
                                        micro_batch=b, grad_accum_steps=m, activation_checkpointing=ckpt,
                                        pipeline_schedule=schedule, virtual_stages=v, offload=offs[-1]))
                                continue
                            for off in offs:
                                if OFFLOAD_RANK[off] >= least_fitted_offload:
                                    result.dominated += 1
                                    continue
                                static = statics[off]
                                result.evaluated += 1
                                total = combined_total(static, acts, pp)
                                if total > limit:
                                    result.out_of_memory += 1
                                    if not result.fitting:
                                        _track_closest(ctx, result, static, acts, base.layout(
                                            micro_batch=b, grad_accum_steps=m, activation_checkpointing=ckpt,
                                            pipeline_schedule=schedule, virtual_stages=v, offload=off))
                                    continue
                                if total <= roomy:
                                    least_fitted_offload = OFFLOAD_RANK[off]
                                any_fit_at_b = True
                                result.fitting += 1
                                if stop_at_first_fit:
                                    layout = base.layout(micro_batch=b, grad_accum_steps=m,
                                                         activation_checkpointing=ckpt, pipeline_schedule=schedule,
                                                         virtual_stages=v, offload=off)
                                    result.best = Candidate(layout=layout, fits=True, total=total, parts=(static, acts))
                                    return result
                                if not timed:
                                    continue
                                if off != "none" and result.best is not None and result.best.tier <= 1:
                                    # A layout the runtime runs already fits: one needing offload cannot win.
                                    result.gap_dimensions.add(("offload", off))
                                    continue
                                if fwd is None:
                                    fwd = _forward(ctx, forwards, base, b)
                                if result.prunes() and result.best is not None and _time_floor(
                                        fwd, ckpt, attention, grad_accum_steps=m, pp=pp, virtual_stages=v,
                                ) > PRUNE_FACTOR * result.best.step_s:
                                    # Too slow to be chosen or shown: not timed further.
                                    result.pruned_dimensions.update(
                                        zip(DIMENSIONS, (tp, pp, cp, sharding, ckpt, off), strict=True))
                                    continue
                                layout = base.layout(micro_batch=b, grad_accum_steps=m, activation_checkpointing=ckpt,
                                                     pipeline_schedule=schedule, virtual_stages=v, offload=off)
                                cand = Candidate(layout=layout, fits=True, total=total, parts=(static, acts),
                                                 tier=2 * has_gap(layout, precision) + (total > roomy))
                                _rank(ctx, cand, result, fwd, static)
                    if not any_fit_at_b and not pins.micro_batch and pins.pipeline_schedule != "gpipe":
                        # Activations only grow with the micro-batch: larger ones cannot fit either.
                        skipped = len([x for x in mbs if x > b])
                        result.out_of_memory += skipped * len(schedules) * len(ckpts) * len(offs)
                        break
    if timed and not stop_at_first_fit:
        choose(ctx, result)
    return result


def choose(ctx: Context, result: SearchResult) -> None:
    """Pick the plan among the timed fitting layouts (see the module doc): the best tier, then the
    simplest layout within `SIMPLER_WITHIN` of that tier's fastest. Sets `best`, `fastest` and
    `decided_by` (what made the choice differ from the plain fastest layout)."""
    if not result.timed:
        return
    tier = min(c.tier for c in result.timed)
    pool = [c for c in result.timed if c.tier == tier]
    fastest = min(pool, key=lambda c: (c.step_s, c.total, c.layout.simplicity()))
    near = [c for c in pool if c.step_s <= fastest.step_s * (1 + SIMPLER_WITHIN)]
    chosen = min(near, key=lambda c: (c.layout.simplicity(), c.step_s, c.total))
    result.best, result.fastest = chosen, fastest
    decided: list[str] = []
    if tier >= 2:
        decided.append("gap")
    if tier % 2 == 0 and any(c.tier == tier + 1 and c.step_s < chosen.step_s for c in result.timed):
        decided.append("headroom")  # a faster layout of the same kind leaves too little memory free
    if chosen is not fastest and chosen.step_s > fastest.step_s * (1 + 1e-9):
        decided.append("simplicity")
    result.decided_by = decided


def _forward(ctx: Context, cache: dict[tuple[int, ...], ForwardTimes], base: Base, b: int) -> ForwardTimes:
    """Forward times at micro-batch `b`: they depend only on tp, cp, pp, b and sequence parallelism."""
    _, tp, pp, cp = base.mesh
    sp = base.sequence_parallel
    key = (tp, cp, pp, b, sp)
    fwd = cache.get(key)
    if fwd is None:
        probe = Base(mesh=base.mesh, sharding="ddp", dp_shard=1, sequence_parallel=sp).layout(micro_batch=b)
        fwd = cache[key] = forward_times(ctx.shape, ctx.cluster, probe, precision=ctx.precision,
                                         attention=ctx.attention)
    return fwd


def _track_closest(ctx: Context, result: SearchResult, static: StaticMemory, acts: ActivationMemory,
                   layout: Layout) -> None:
    """Keep `layout` (which does not fit) as the closest to fitting if its memory pressure is the lowest yet."""
    cpu = max(static.cpu_per_node_first, static.cpu_per_node_last) / (ctx.cluster.cpu_memory_gib * 2**30)
    pressure = max(combined_total(static, acts, layout.pp) / ctx.limit, cpu)
    if pressure < result.closest_ratio:
        result.closest = Candidate.of(layout, combine(static, acts, layout.pp), False)
        result.closest_ratio = pressure


def _time_floor(fwd: ForwardTimes, ckpt: Checkpointing, attention: str, *, grad_accum_steps: int, pp: int,
                virtual_stages: int) -> float:
    """A lower bound of the step time: compute, recompute and bubble, without communication."""
    per_mb = 3 * (fwd.layers * fwd.layer_f + fwd.head_f)
    if ckpt == "full":
        per_mb += fwd.layers * fwd.layer_f
    elif ckpt == "selective" and attention == "eager":
        per_mb += fwd.layers * fwd.attn_f
    bubble = (pp - 1) / virtual_stages if pp > 1 else 0.0
    return (grad_accum_steps + bubble) * per_mb


def _rank(ctx: Context, cand: Candidate, result: SearchResult, forward: ForwardTimes,
          static: StaticMemory) -> None:
    lay = cand.layout
    cand.time = step_time(ctx.shape, ctx.cluster, lay, precision=ctx.precision,
                          optimizer=ctx.optimizer, attention=ctx.attention, forward=forward,
                          stages=static.stages)
    result.timed.append(cand)
    key = cand.key()
    best = result.best
    if best is None or key < best.key():
        result.best = cand
    by_signature, by_dimension = result.by_signature, result.by_dimension
    sig = (lay.dp, lay.tp, lay.pp, lay.cp, lay.sharding, lay.dp_shard, lay.offload)
    held = by_signature.get(sig)
    if held is None or key < held.key():
        by_signature[sig] = cand
    for dkey in (("tp", lay.tp), ("pp", lay.pp), ("cp", lay.cp), ("sharding", lay.sharding),
                 ("activation_checkpointing", lay.activation_checkpointing), ("offload", lay.offload)):
        held = by_dimension.get(dkey)
        if held is None or key < held.key():
            by_dimension[dkey] = cand


def evaluate_layout(ctx: Context, layout: Layout) -> Candidate:
    """Memory and time of one complete layout, fitting or not."""
    return _evaluate(ctx, layout)


def smallest_fitting_world(ctx: Context, deadline: Deadline | None = None) -> int | None:
    """The smallest GPU count of this kind on which some layout fits (doubling, then bisection
    over whole nodes; mesh pins other than dp are kept). Each search it runs keeps to `deadline`."""
    base = ctx.spec.layout.model_copy(update={"dp": None})
    gpn = ctx.cluster.gpus_per_node if ctx.cluster.world_size >= ctx.spec.resources.gpus_per_node else (
        ctx.spec.resources.gpus_per_node)

    def fits(world: int) -> bool:
        res = ctx.spec.resources.model_copy(update={"gpus": world, "nodes": None})
        try:
            sub = Context(spec=ctx.spec, shape=ctx.shape, cluster=resolve_cluster(res))
        except InvalidSpec:
            return False
        pins = base
        for name in ("tp", "pp", "cp"):
            value = getattr(pins, name)
            if value is not None and world % value:
                return False
        return search(sub, pins, timed=False, stop_at_first_fit=True, deadline=deadline).best is not None

    sizes = [w for w in (1, 2, 4) if w < gpn] + [gpn]
    for world in sizes:
        if fits(world):
            return world
    lo, nodes = 1, 2
    while nodes * gpn <= MAX_WORLD_FOR_FIT_SEARCH:
        if fits(nodes * gpn):
            break
        lo, nodes = nodes, nodes * 2
    else:
        return None
    hi = nodes
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid * gpn):
            hi = mid
        else:
            lo = mid
    return hi * gpn
