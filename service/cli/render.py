"""Human rendering of plans for the terminal: GiB, seconds, percentages (the API stays in bytes)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pydantic
from rich.console import Console, Group
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from service.planner import FieldProblem, Plan
from service.spec import field_path

GIB = 1024**3

# The CLI's exit codes (README "Exit codes", `shardctl plan --help`).
EXIT_OK = 0  # done; every plan fits
EXIT_ERROR = 1  # an invalid spec, a bad command line, an API or other error
EXIT_DOES_NOT_FIT = 2  # a plan (or a submission) for which no layout fits
EXIT_UNREADABLE = 3  # a spec file that does not exist or cannot be read


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
    parts.append(Text(considered_sentence(plan), style="dim"))
    for warning in plan.warnings:
        parts.append(Text("warning: " + warning, style="yellow"))
    return Panel(Group(*parts), title="shardctl plan", expand=False)  # type: ignore[arg-type]


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def considered_sentence(plan: Plan) -> str:
    """How many layouts the search considered and what became of them; the parts add up to the total.

    Most out-of-memory layouts are ruled out in bulk by a bound (model states alone over the
    limit, a smaller micro-batch that already did not fit), without being built."""
    r = plan.rejected
    chosen = 1 if plan.fits else 0
    total = chosen + r.slower + r.out_of_memory + r.dominated
    head = "1 chosen" if plan.fits else "none fits (the closest is shown)"
    return (f"Considered {_plural(total, 'layout')}: {head}, {r.slower:,} fitting but not chosen,"
            f" {r.out_of_memory:,} out of memory, {r.dominated:,} dominated (a variant with less offload,"
            f" or one the runtime runs, fits); {_plural(r.invalid, 'mesh or micro-batch choice')} invalid.")


def plan_line(plan: Plan) -> str:
    """The plan in one line: `name: layout, step time, memory, fits`."""
    mem = plan.memory
    verdict = "fits" if plan.fits else "does not fit" + (
        f" (smallest GPU count that fits: {plan.min_gpus_to_fit})" if plan.min_gpus_to_fit is not None else "")
    return (f"{plan.name}: {plan.layout.short()} on {plan.world_size} x {plan.gpu},"
            f" {human_seconds(plan.time.step_s)}/step, {gib(mem.total)} / {gib(mem.gpu_memory)} GiB, {verdict}")


def pydantic_problems(exc: pydantic.ValidationError, prefix: tuple[str, ...] = ()) -> list[FieldProblem]:
    """pydantic's errors as `FieldProblem`s: a dotted field path and a message (no documentation links)."""
    return [
        FieldProblem(loc=prefix + tuple(field_path(tuple(e["loc"])).split(".")),
                     message=e["msg"].removeprefix("Value error, "))
        for e in exc.errors()
    ]


def print_problems(console: Console, source: str, problems: Iterable[FieldProblem]) -> None:
    """`source: invalid spec`, then one `  field.path: message` line per problem."""
    console.print(f"[bold red]{escape(source)}: invalid spec[/]", soft_wrap=True)
    for p in problems:
        console.print(f"  [bold]{escape(p.path or '(spec)')}[/]: {escape(p.message)}", soft_wrap=True)


def print_error(console: Console, message: str, source: str | None = None) -> None:
    """`error: message` (or `source: message`), with the message printed as is: no markup, no wrapping."""
    head = f"[bold red]{escape(source)}[/]:" if source else "[bold red]error:[/]"
    console.print(f"{head} {escape(message)}", soft_wrap=True, highlight=False)


_YAML_SOURCE = re.compile(r'in "<[^>]*>", ')


def unreadable_message(path: Path, exc: OSError | UnicodeDecodeError) -> str:
    """Why a spec file cannot be read, without repeating its path."""
    if isinstance(exc, UnicodeDecodeError):
        return f"cannot read: not UTF-8 text ({exc.reason} at byte {exc.start})"
    if isinstance(exc, FileNotFoundError):
        return "no such file"
    if isinstance(exc, IsADirectoryError):
        return "is a directory, not a spec file"
    return f"cannot read: {exc.strerror or exc}"


def spec_error_message(path: Path, exc: ValueError) -> str:
    """A spec loader's message without the path it already starts with, and YAML's `in "<unicode
    string>"` (the file is the path the CLI prints in front)."""
    text = str(exc)
    for prefix in (f"{path}: ", f"{path.as_posix()}: "):
        text = text.removeprefix(prefix)
    return _YAML_SOURCE.sub("at ", text)


def attempt_lines(attempt: dict[str, Any], tail_lines: int = 15) -> list[str]:
    """One attempt of `GET /v1/jobs/{id}` for `shardctl show`: number, name, status, nodes; then, when
    it ended badly, its failure class, the program's exit code, the reason and the last `tail_lines`
    lines the program printed (indented)."""
    nodes = ", ".join(attempt.get("nodes") or [])
    lines = [f"  attempt {attempt['number']} {attempt['backend_name']} {attempt['status']}"
             + (f" on {nodes}" if nodes else "")]
    failure, code, reason = attempt.get("failure"), attempt.get("exit_code"), attempt.get("exit_reason")
    if failure or (code not in (None, 0)):
        lines.append(f"    {failure or 'failed'}" + (f", exit code {code}" if code is not None else "")
                     + (f": {reason}" if reason else ""))
    elif reason:
        lines.append(f"    {reason}")
    tail = (attempt.get("log_tail") or "").splitlines()[-tail_lines:]
    if tail:
        lines.append("    last lines:")
        lines += [f"      {line}" for line in tail]
    return lines
