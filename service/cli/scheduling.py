"""`shardctl simulate TRACE` and `shardctl export kueue|slurm --pools FILE`: offline scheduling tools.

Both read files only (no server): the pools-and-quotas YAML of `SHARDCTL_POOLS_FILE`
(`service.scheduling.config_file`), or a trace (that file plus `settings` and `jobs`,
`service.scheduling.simulate`). Exit codes: 0 done; 1 an invalid file (one `field.path: message`
line per problem) or an export that does not apply; 3 a file that cannot be read.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, TypeVar

import pydantic
import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from service.cli.render import EXIT_ERROR, EXIT_UNREADABLE, human_seconds, pydantic_problems
from service.scheduling.config_file import PoolsFile, PoolsFileError, load_pools_file
from service.scheduling.export_kueue import render_kueue, to_yaml
from service.scheduling.export_slurm import render_slurm
from service.scheduling.simulate import SimResult, load_trace, simulate

console = Console()
err = Console(stderr=True)
export_app = typer.Typer(help="Render the pools and team quotas for the schedulers teams already run.",
                         no_args_is_help=True)
T = TypeVar("T")

PoolsOpt = Annotated[Path, typer.Option("--pools", help="The pools-and-quotas YAML (the SHARDCTL_POOLS_FILE"
                                        " format: pools, teams).", show_default=False)]


def _read(path: Path, load: Callable[[Path], T], what: str) -> T:
    try:
        return load(path)
    except pydantic.ValidationError as exc:
        err.print(f"[bold red]{escape(str(path))}: invalid {what}[/]", soft_wrap=True)
        for p in pydantic_problems(exc):
            message = p.message
            path_text = p.path
            if not path_text and ": " in message and "." in message.split(": ", 1)[0]:
                path_text, message = message.split(": ", 1)  # a whole-file rule names its field first
            err.print(f"  [bold]{escape(path_text or '(file)')}[/]: {escape(message)}", soft_wrap=True)
        raise typer.Exit(EXIT_ERROR) from None
    except PoolsFileError as exc:
        err.print(f"[bold red]error:[/] {escape(str(exc))}", soft_wrap=True)
        code = EXIT_UNREADABLE if "cannot read" in str(exc) else EXIT_ERROR
        raise typer.Exit(code) from None
    except ValueError as exc:
        err.print(f"[bold red]error:[/] {escape(str(path))}: {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(EXIT_ERROR) from None


def simulate_command(
    trace: Annotated[Path, typer.Argument(help="The trace: pools, teams, settings, jobs (YAML or JSON).",
                                          show_default=False)],
    as_json: Annotated[bool, typer.Option("--json", help="Print the whole result as JSON.")] = False,
    show_log: Annotated[bool, typer.Option("--log", help="Also print the schedule, one event a line.")] = False,
) -> None:
    """Replay a trace through the admission engine in virtual time: per-team GPU-hour shares, waits,
    preemptions and the schedule's digest (the same trace always gives the same digest)."""
    parsed = _read(trace, load_trace, "trace")
    try:
        result = simulate(parsed, keep_log=show_log)
    except ValueError as exc:
        err.print(f"[bold red]error:[/] {escape(str(trace))}: {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(EXIT_ERROR) from None
    if as_json:
        console.out(json.dumps(result.model_dump(mode="json", exclude={"first_start", "submitted"}), indent=2))
        return
    _print_result(result)


def _print_result(result: SimResult) -> None:
    table = Table(title=f"simulated {result.end_s / 3600:.2f} h, {result.cycles} admission cycles",
                  box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("team", "GPU-h", "share", "jobs", "done", "avg wait", "max wait", "preempt", "lost GPU-h"):
        table.add_column(col, justify="left" if col == "team" else "right", min_width=len(col))
    for team, t in result.teams.items():
        table.add_row(team, f"{t.gpu_seconds / 3600:.1f}", f"{t.share * 100:.1f}%", str(t.jobs), str(t.finished),
                      human_seconds(t.mean_wait_s), human_seconds(t.max_wait_s), str(t.preempted),
                      f"{t.lost_gpu_seconds / 3600:.2f}")
    console.print(table)
    console.out(f"preemptions: {result.preemptions}; jobs not started by the end: {len(result.never_started)}")
    console.out(f"schedule digest: {result.digest}")
    for line in result.log:
        console.out(line, highlight=False)


@export_app.command("kueue")
def export_kueue(pools: PoolsOpt) -> None:
    """Kueue objects (ResourceFlavors, Cohorts, ClusterQueues, LocalQueues, WorkloadPriorityClasses) as
    YAML, for `kubectl apply -f -`."""
    pf = _read(pools, load_pools_file, "pools file")
    console.out(to_yaml(_render(pools, lambda: render_kueue(pf))), highlight=False)


@export_app.command("slurm")
def export_slurm(
    pools: PoolsOpt,
    cluster: Annotated[str | None, typer.Option(help="Add cluster=NAME to each account.")] = None,
) -> None:
    """`sacctmgr -i` commands: accounts per group and team (fair share, GrpTRES), QOS per priority band."""
    pf: PoolsFile = _read(pools, load_pools_file, "pools file")
    for line in _render(pools, lambda: render_slurm(pf, cluster=cluster)):
        console.out(line, highlight=False)


def _render(path: Path, fn: Callable[[], T]) -> T:
    try:
        return fn()
    except ValueError as exc:
        err.print(f"[bold red]error:[/] {escape(str(path))}: {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(EXIT_ERROR) from None


def register(app: typer.Typer) -> None:
    """Add `simulate` and `export` to the `shardctl` app."""
    app.command("simulate")(simulate_command)
    app.add_typer(export_app, name="export")


__all__ = ["export_app", "register", "simulate_command"]
