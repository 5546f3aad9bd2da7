"""`shardctl calibrate`: the correction factors the server applies to plans (`GET /v1/calibration`),
and the one line of a job's prediction error that `shardctl show` prints. Read-only: the server
applies a factor by itself once its GPU kind and layout family has enough runs."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from service.cli.client import Api, CliError
from service.cli.render import gib, print_error

console = Console()
err = Console(stderr=True)


def _factor(f: dict[str, Any] | None, min_runs: int) -> tuple[str, str]:
    """(factor cell, error cell) of one factor: `x1.18` (or `x1.18 unused: 3 of 5 runs`) and `23% -> 4%`."""
    if f is None:
        return "-", "-"
    value = f"x{f['value']:.3g}" + ("" if f["used"] else f" (unused: {f['runs']} of {min_runs} runs)")
    return value, f"{f['error_before']:.1%} -> {f['error_after']:.1%}"


def calibration_table(doc: dict[str, Any]) -> Table:
    """One row per GPU kind and family: runs, factors, mean absolute error before -> after."""
    whose = f"team {doc['team']}" if doc.get("team") else "every team's runs"
    table = Table("gpu", "family", "runs", "step time", "step error", "peak memory", "memory error",
                  title=f"Calibration of {whose} (a factor is used from {doc['min_runs']} runs)")
    for g in doc["groups"]:
        step, step_err = _factor(g["step"], doc["min_runs"])
        mem, mem_err = _factor(g["memory"], doc["min_runs"])
        table.add_row(g["gpu"], g["family"], str(g["runs"]), step, step_err, mem, mem_err)
    return table


def calibrate(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
              team: Annotated[str | None, typer.Option("--team", help="The team (admins; members see their own).")]
              = None) -> None:
    """A team's calibration factors per GPU kind and layout family: runs, factor, error before -> after.

    Factors come from the team's succeeded jobs' measured step time and peak memory (median of measured
    / predicted by the job's stored plan); the team's plans use a family's factors once it has enough runs."""
    try:
        doc = Api().request("GET", "/v1/calibration", params={"team": team} if team else None)
    except CliError as exc:
        print_error(err, str(exc))
        raise typer.Exit(exc.exit_code) from None
    if as_json:
        console.out(json.dumps(doc, indent=2), highlight=False)
        return
    if not doc["groups"]:
        console.out("no measured runs yet: plans use the model's figures", highlight=False)
        return
    console.print(calibration_table(doc))
    console.out(f"rule: {doc['rule']}", highlight=False)


def prediction_error_line(error: dict[str, Any]) -> str:
    """`Prediction error: step time +12.3% (1.12 s measured, 1.00 s predicted), peak memory -4.0% (...)`."""
    parts = []
    if error.get("step_ratio") is not None:
        parts.append(f"step time {error['step_ratio'] - 1:+.1%} ({error['measured_step_s']:.3g} s measured,"
                     f" {error['predicted_step_s']:.3g} s predicted)")
    if error.get("memory_ratio") is not None:
        parts.append(f"peak memory {error['memory_ratio'] - 1:+.1%} ({gib(error['measured_peak_bytes'])} GiB measured,"
                     f" {gib(error['predicted_peak_bytes'])} GiB predicted)")
    if not parts:
        return "Prediction error: nothing measured yet"
    return "Prediction error: " + ", ".join(parts) + ("; the plan was calibrated" if error.get("calibrated") else "")
