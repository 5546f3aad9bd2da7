"""Words for a plan: where the run sits on the sharding rubric, why this layout, why the others lose,
and what to watch out for."""

from __future__ import annotations

from service.planner.hardware import GB, GIB
from service.planner.layout import Layout
from service.planner.memory import Memory, memory
from service.planner.search import Context
from service.planner.timing import StepTime
from service.spec import Sharding


def gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def rubric(ctx: Context) -> str:
    """One sentence: does plain DDP fit, or ZeRO-1, ZeRO-2, full sharding, or is TP/PP needed?

    Each level is tried with tp = pp = cp = 1, every GPU data-parallel, micro-batch 1 and full
    checkpointing (the least activation memory), no offload.
    """
    world = ctx.cluster.world_size
    limit = ctx.cluster.memory_bytes_per_gpu
    levels: list[tuple[Sharding, str]] = [
        ("ddp", "DDP"), ("zero1", "ZeRO-1"), ("zero2", "ZeRO-2"), ("fsdp", "ZeRO-3/FSDP")]
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
                return (f"DDP fits: every GPU holds the full model states ({model_states / GB:.1f} GB)"
                        f" and still has room for activations within {gib(limit)}.")
            return (f"DDP does not fit (model states {states['DDP'] / GB:.1f} GB per GPU against"
                    f" {gib(limit)}); {label} is the first level that fits, with {model_states / GB:.1f} GB"
                    f" of model state per GPU ({gib(mem.total)} in all at micro-batch 1 with full"
                    " checkpointing).")
    return (f"Needs tensor or pipeline parallelism (or offload): even fully sharded over {world} GPUs"
            f" the model states take {states['ZeRO-3/FSDP'] / GB:.1f} GB per GPU plus activations,"
            f" against {gib(limit)} (DDP would need {states['DDP'] / GB:.1f} GB).")


_PARTS = ("compute_s", "recompute_s", "comm_exposed_s", "bubble_s", "optimizer_s", "offload_s")
_PART_WORDS = {"compute_s": "compute", "recompute_s": "recompute", "comm_exposed_s": "exposed communication",
               "bubble_s": "pipeline bubble", "optimizer_s": "optimizer step", "offload_s": "offload traffic"}


def why_slower(chosen: StepTime, other: StepTime) -> str:
    """E.g. `+12% step time, mostly exposed communication (+0.041 s)`."""
    diffs = {p: getattr(other, p) - getattr(chosen, p) for p in _PARTS}
    worst = max(diffs, key=lambda p: diffs[p])
    pct = other.step_s / chosen.step_s - 1
    if pct < 0.002:
        return "as fast within 0.2%; loses on memory headroom or simplicity"
    return f"+{pct:.0%} step time, mostly {_PART_WORDS[worst]} (+{diffs[worst]:.3g} s)"


def memory_sentence(mem: Memory, limit: int) -> str:
    parts = {"params": mem.params, "grads": mem.grads, "optimizer": mem.optimizer,
             "activations": mem.activations, "logits": mem.logits, "comm buffers": mem.comm_buffers}
    top = sorted(parts.items(), key=lambda kv: -kv[1])[:2]
    return (f"Memory: {gib(mem.total)} of {gib(limit)} per GPU ({mem.total / limit:.0%}); largest parts:"
            f" {top[0][0]} {gib(top[0][1])}, {top[1][0]} {gib(top[1][1])}.")
