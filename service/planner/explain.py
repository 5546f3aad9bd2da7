"""Words for a plan: where the run sits on the sharding rubric, why this layout, why the others lose,
and what to watch out for."""

from __future__ import annotations

from service.planner.hardware import GIB
from service.planner.layout import Layout
from service.planner.memory import Memory, memory
from service.planner.search import Context
from service.planner.timing import StepTime
from service.spec import Sharding


def gib(n: float) -> str:
    """Bytes as GiB, the one unit of every sentence: `54.6 GiB`, `7.48 GiB`, `0.0123 GiB`."""
    v = n / GIB
    return f"{v:.1f} GiB" if v >= 10 else f"{v:.3g} GiB"


def plural(n: int, word: str, many: str | None = None) -> str:
    """`1 layout`, `2 layouts`, `1 GPU`, `8 GPUs`."""
    return f"{n} {word if n == 1 else (many or word + 's')}"


def seconds(x: float) -> str:
    """Seconds with three significant digits and an explicit sign: `+0.700 s`, `-2.71 s`."""
    return f"{x:+.3g} s"


def rubric(ctx: Context) -> str:
    """One sentence: does plain DDP fit, or ZeRO-1, ZeRO-2, full sharding, or is TP/PP/offload needed?

    Each level is tried with tp = pp = cp = 1, every GPU data-parallel, micro-batch 1 and full
    checkpointing (the least activation memory), no offload. Sizes are GiB, like the rest of the plan.
    """
    world = ctx.cluster.world_size
    limit = ctx.cluster.memory_bytes_per_gpu
    levels: list[tuple[Sharding, str]] = [
        ("ddp", "DDP"), ("zero1", "ZeRO-1"), ("zero2", "ZeRO-2"), ("fsdp", "ZeRO-3/FSDP")]
    if world == 1:
        levels = levels[:1]  # one GPU: nothing to shard over
    states: dict[str, float] = {}
    for sharding, label in levels:
        layout = Layout(
            dp=world, tp=1, pp=1, cp=1, sharding=sharding, dp_shard=1 if sharding == "ddp" else world,
            sequence_parallel=False, micro_batch=1, grad_accum_steps=1, activation_checkpointing="full",
            pipeline_schedule=None, virtual_stages=1, offload="none")
        mem = memory(ctx.shape, ctx.cluster, layout, precision=ctx.precision, optimizer=ctx.optimizer,
                     attention=ctx.attention)
        model_states = mem.params + mem.grads + mem.optimizer
        states[label] = model_states
        if mem.total <= limit:
            if sharding == "ddp":
                return (f"DDP fits: every GPU holds the full model states ({gib(model_states)})"
                        f" and still has room for activations within {gib(limit)}.")
            return (f"DDP does not fit (model states {gib(states['DDP'])} per GPU against"
                    f" {gib(limit)}); {label} is the first level that fits, with {gib(model_states)}"
                    f" of model state per GPU ({gib(mem.total)} in all at micro-batch 1 with full"
                    " checkpointing).")
    if world == 1:
        return (f"DDP does not fit on 1 GPU (model states {gib(states['DDP'])} plus activations against"
                f" {gib(limit)}): it needs offload to host memory, or more GPUs.")
    return (f"Needs tensor or pipeline parallelism (or offload): even fully sharded over"
            f" {plural(world, 'GPU')} the model states take {gib(states['ZeRO-3/FSDP'])} per GPU plus"
            f" activations, against {gib(limit)} (DDP would need {gib(states['DDP'])}).")


_PARTS = ("compute_s", "recompute_s", "comm_exposed_s", "bubble_s", "optimizer_s", "offload_s")
_PART_WORDS = {"compute_s": "compute", "recompute_s": "recompute", "comm_exposed_s": "exposed communication",
               "bubble_s": "pipeline bubble", "optimizer_s": "optimizer step", "offload_s": "offload traffic"}


def why_slower(chosen: StepTime, other: StepTime) -> str:
    """How `other`'s step time compares with `chosen`'s, in numbers that agree with each other:
    `+4.0% step time (+0.7 s per step): exposed communication +3.4 s, partly offset by compute -2.7 s`,
    or `9.3% faster (-0.326 s per step), mostly exposed communication (-0.199 s)`.

    The percentage is the difference in seconds over the chosen step time; the parts named are the
    largest increase (and, when it is more than the whole difference, the largest decrease), said
    to be "mostly" only when it is more than half the difference, else "largest part"."""
    delta = other.step_s - chosen.step_s
    pct = delta / chosen.step_s
    if abs(pct) < 0.0005:
        return f"the same step time within 0.05% ({seconds(delta)} per step)"
    diffs = {p: getattr(other, p) - getattr(chosen, p) for p in _PARTS}
    up = max(diffs, key=lambda p: diffs[p])
    down = min(diffs, key=lambda p: diffs[p])
    if delta > 0:
        head, main, rest = f"{pct:+.1%} step time ({seconds(delta)} per step)", up, down
    else:
        head, main, rest = f"{-pct:.1%} faster ({seconds(delta)} per step)", down, up
    if diffs[rest] * delta < 0 and abs(diffs[main]) > 1.05 * abs(delta):
        return (f"{head}: {_PART_WORDS[main]} {seconds(diffs[main])}, partly offset by"
                f" {_PART_WORDS[rest]} {seconds(diffs[rest])}")
    share = "mostly" if abs(diffs[main]) > 0.5 * abs(delta) else "largest part"
    return f"{head}, {share} {_PART_WORDS[main]} ({seconds(diffs[main])})"


_SIMPLER_WORDS = ("less offload", "fewer parallel dimensions", "plainer sharding", "less recompute",
                  "fewer virtual stages", "a smaller model-parallel group")


def simpler_words(simple: Layout, other: Layout) -> str:
    """What makes `simple` simpler than `other` (the first field of `Layout.simplicity` that differs)."""
    for word, a, b in zip(_SIMPLER_WORDS, simple.simplicity(), other.simplicity(), strict=True):
        if a != b:
            if word == "plainer sharding":
                return f"{simple.sharding} rather than {other.sharding}"
            dims = [d for d in ("tp", "pp", "cp") if getattr(other, d) > 1 and getattr(simple, d) == 1]
            if word == "fewer parallel dimensions" and dims:
                return "no " + "/".join(dims)
            return word
    return "as simple"


def memory_sentence(mem: Memory, limit: int) -> str:
    parts = {"params": mem.params, "grads": mem.grads, "optimizer": mem.optimizer,
             "activations": mem.activations, "logits": mem.logits, "comm buffers": mem.comm_buffers}
    top = sorted(parts.items(), key=lambda kv: -kv[1])[:2]
    return (f"Memory: {gib(mem.total)} of {gib(limit)} per GPU ({mem.total / limit:.0%}); largest parts:"
            f" {top[0][0]} {gib(top[0][1])}, {top[1][0]} {gib(top[1][1])}.")
