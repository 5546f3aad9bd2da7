"""``shardctl profile``: analyse PyTorch profiler traces offline (one file per rank)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from service.profiles import ProfileSummary, TraceError, analyze_traces
from service.profiles.events import DEFAULT_MAX_EVENTS

profile_app = typer.Typer(
    help="Analyse PyTorch profiler traces (Chrome/Kineto JSON, one per rank).", no_args_is_help=True
)


def _fmt(value: float | None, unit: str = "%") -> str:
    return "-" if value is None else f"{value:.2f}{unit}"


def _render(summary: ProfileSummary, console: Console) -> None:
    table = Table(title="Per-rank step breakdown (% of the analysed step windows)")
    for col in (
        "rank",
        "basis",
        "steps",
        "step ms",
        "compute only",
        "comm only",
        "compute+comm",
        "memory",
        "idle",
        "data loader",
        "peer wait",
        "overlap",
        "HTA idle/compute/non-compute",
        "HTA overlap",
    ):
        table.add_column(col, justify="right")
    for key in sorted(summary.ranks, key=int):
        r = summary.ranks[key]
        p = r.partition
        h = r.hta_compat
        hta = (
            "n/a"
            if not h.applicable
            else f"{_fmt(h.idle_time_pctg)}/{_fmt(h.compute_time_pctg)}/{_fmt(h.non_compute_time_pctg)}"
        )
        memory = (
            p.pct["memory_only"]
            + p.pct["compute_memory"]
            + p.pct["comm_memory"]
            + p.pct["compute_comm_memory"]
        )
        table.add_row(
            key,
            r.timeline_basis,
            str(len(r.per_step)),
            f"{r.step_time_us_mean / 1e3:.2f}",
            _fmt(p.pct["compute_only"]),
            _fmt(p.pct["comm_only"]),
            _fmt(p.pct["compute_comm"]),
            _fmt(memory),
            _fmt(p.pct["idle"]),
            _fmt(100 * r.idle.data_loader_us / r.window_us if r.window_us else 0.0),
            _fmt(100 * r.idle.waiting_on_peer_us / r.window_us if r.window_us else 0.0),
            _fmt(r.overlap.comm_overlapped_by_compute_pct),
            hta,
            _fmt(h.comm_comp_overlap_pctg) if h.applicable else "n/a",
        )
    console.print(table)
    c = summary.cross_rank
    console.print(
        f"Step time: mean {c.step_time_us_mean / 1e3:.2f} ms, spread {c.step_time_spread_pct:.2f}%,"
        f" slowest rank {c.slowest_rank}"
    )
    if c.straggler:
        console.print(
            f"Straggler: rank {c.straggler.rank} arrived last at {c.straggler.arrived_last_pct:.1f}% of "
            f"{c.straggler.matched_collectives} collectives"
        )
    d = summary.diagnosis
    console.print(f"[bold]Verdict: {d.bound}[/bold] (confidence {d.confidence})")
    for line in d.evidence:
        console.print(f"  - {line}")
    for rec in d.recommendations:
        console.print(f"[bold]{rec.id}[/bold]: {rec.text}")
    if d.plan:
        console.print(f"Plan: {d.plan.text}")


@profile_app.callback()
def _group() -> None:
    """Analyse PyTorch profiler traces (keeps ``analyze`` a sub-command)."""


@profile_app.command("analyze")
def analyze(
    traces: list[Path] = typer.Argument(..., help="Trace files, one per rank (.json or .json.gz)."),
    as_json: bool = typer.Option(False, "--json", help="Print the full summary as JSON."),
    predicted_comm_fraction: float | None = typer.Option(
        None,
        "--predicted-comm-fraction",
        min=0.0,
        max=1.0,
        help="The plan's predicted communication share of a step (0-1), to compare with the measurement.",
    ),
    max_events: int = typer.Option(
        DEFAULT_MAX_EVENTS,
        "--max-events",
        min=1,
        help="Refuse a rank's trace with more complete events than this (bounds memory: up to ~500 bytes each).",
    ),
) -> None:
    """Summarise where each rank's step time goes, find the straggler and give a verdict."""
    try:
        summary = analyze_traces(traces, predicted_comm_fraction=predicted_comm_fraction, max_events=max_events)
    except TraceError as exc:
        Console(stderr=True).print(f"[red]error:[/red] {exc}", soft_wrap=True, highlight=False, markup=True)
        raise typer.Exit(code=1) from exc
    if as_json:
        typer.echo(summary.model_dump_json(indent=2))
    else:
        _render(summary, Console())
