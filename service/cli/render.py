"""Human rendering of plans for the terminal: GiB, seconds, percentages (the API stays in bytes)."""

from __future__ import annotations

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from service.planner import FieldProblem, Plan

GIB = 1024**3


def gib(n: float) -> str:
    return f"{n / GIB:.2f}"


def human_seconds(s: float) -> str:
    if s < 1:
        return f"{s * 1000:.1f} ms"
    if s < 120:
        return f"{s:.2f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def plan_panel(plan: Plan, width: int = 120) -> Panel:
    """The whole plan as one panel: layout, memory, time, why, runners-up, warnings."""
    lay, mem, t = plan.layout, plan.memory, plan.time
    status = Text("fits", style="bold green") if plan.fits else Text("does not fit", style="bold red")
    head = Text.assemble(
        (f"{plan.name}", "bold"), f"  {plan.model} ({plan.model_params / 1e9:.2f}B params) on ",
        f"{plan.world_size} x {plan.gpu} ({plan.nodes} node{'s' if plan.nodes > 1 else ''})  ", status)

    layout = Table(title="Layout", show_header=False, box=None, pad_edge=False)
    for key, value in (
        ("dp x tp x pp x cp", f"{lay.dp} x {lay.tp} x {lay.pp} x {lay.cp}"),
        ("sharding", lay.sharding + (f" (shard group {lay.dp_shard})" if lay.sharding == "hsdp" else "")),
        ("sequence parallel", "yes" if lay.sequence_parallel else "no"),
        ("micro-batch x accumulation", f"{lay.micro_batch} x {lay.grad_accum_steps}"),
        ("activation checkpointing", lay.activation_checkpointing),
        ("pipeline schedule", (lay.pipeline_schedule or "-") + (
            f" (v={lay.virtual_stages})" if lay.virtual_stages > 1 else "")),
        ("offload", lay.offload),
        ("precision", f"{plan.precision.compute}" + (" + loss scaler" if plan.precision.loss_scaler else "")),
    ):
        layout.add_row(key, value)

    memory = Table(title="Memory per GPU (GiB)", show_header=False, box=None, pad_edge=False)
    for key in ("params", "grads", "optimizer", "activations", "logits", "comm_buffers", "runtime_overhead",
                "allocator_margin"):
        memory.add_row(key.replace("_", " "), gib(getattr(mem, key)))
    memory.add_row(Text("total", style="bold"), Text(f"{gib(mem.total)} / {gib(mem.gpu_memory)}",
                                                    style="bold green" if mem.fits else "bold red"))
    if mem.cpu_memory:
        memory.add_row("host per node", f"{gib(mem.cpu_memory)} / {gib(mem.cpu_memory_available or 0)}")

    timing = Table(title="Step time", show_header=False, box=None, pad_edge=False)
    for key, value in (
        ("compute", human_seconds(t.compute_s)), ("recompute", human_seconds(t.recompute_s)),
        ("exposed comm", human_seconds(t.comm_exposed_s)), ("pipeline bubble", human_seconds(t.bubble_s)),
        ("optimizer", human_seconds(t.optimizer_s)), ("offload", human_seconds(t.offload_s)),
        ("step", human_seconds(t.step_s)), ("tokens/s", f"{t.tokens_per_s:,.0f}"),
        ("tokens/s/GPU", f"{t.tokens_per_s_per_gpu:,.0f}"), ("MFU", f"{t.mfu:.1%}"),
        ("job", human_seconds(t.job_s)),
    ):
        timing.add_row(key, value)

    top = Table.grid(padding=(0, 4))
    if width >= 110:
        top.add_row(layout, memory, timing)
    else:
        for table in (layout, memory, timing):
            top.add_row(table)

    parts: list[object] = [head, Text(""), top, Text(""), Text(plan.rubric, style="italic")]
    parts += [Text("• " + line) for line in plan.explanation]
    if plan.reasons:
        parts.append(Text("Why it does not fit:", style="bold red"))
        parts += [Text("  " + r) for r in plan.reasons]
    if plan.min_gpus_to_fit is not None:
        parts.append(Text(f"Smallest {plan.gpu} count that fits: {plan.min_gpus_to_fit}", style="bold"))
    if plan.alternatives:
        alts = Table(title="Runners-up", box=None, pad_edge=False)
        for col in ("layout", "GiB", "step", "MFU", "why not"):
            alts.add_column(col)
        for alt in plan.alternatives:
            alts.add_row(alt.layout.short(), gib(alt.memory_total), human_seconds(alt.step_s),
                         f"{alt.mfu:.1%}", alt.why_not)
        parts += [Text(""), alts]
    r = plan.rejected
    parts.append(Text(f"Evaluated {plan.candidates_evaluated} layouts; rejected: {r.out_of_memory} out of"
                      f" memory, {r.invalid} invalid, {r.dominated} dominated, {r.slower} slower.",
                      style="dim"))
    for warning in plan.warnings:
        parts.append(Text("warning: " + warning, style="yellow"))
    return Panel(Group(*parts), title="shardctl plan", expand=False)  # type: ignore[arg-type]


def print_problems(console: Console, source: str, problems: list[FieldProblem]) -> None:
    console.print(f"[bold red]{source}: invalid spec[/]")
    for p in problems:
        console.print(f"  [bold]{p.path or '(spec)'}[/]: {p.message}")
