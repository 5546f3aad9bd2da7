"""Commands for shared GPUs, over the API: `shardctl why JOB`, `pools list|set|rm`, `quota get|set TEAM`,
`usage TEAM`. The renderers (`explanation_lines`, `pool_rows`, ...) are plain functions of the API's JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

import typer
import yaml
from rich.console import Console
from rich.table import Table

from service.cli.client import Api, CliError
from service.cli.render import EXIT_ERROR, human_seconds, print_error

console = Console()
err = Console(stderr=True)
pools_app = typer.Typer(help="GPU pools: list, declare (admin), remove (admin).", no_args_is_help=True)
quota_app = typer.Typer(help="Team quotas: show, declare (admin).", no_args_is_help=True)
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]


def _call(method: str, path: str, **kw: Any) -> Any:
    try:
        return Api().request(method, path, **kw)
    except CliError as exc:
        print_error(err, str(exc))
        raise typer.Exit(exc.exit_code) from None


def _eta(eta: dict[str, Any] | None) -> str | None:
    if not eta or (eta.get("earliest_s") is None and eta.get("latest_s") is None):
        return None
    low, high = eta.get("earliest_s"), eta.get("latest_s")
    if low == 0 and high == 0:
        return f"starts now ({eta.get('method', '')})"
    band = (f"{human_seconds(low) if low is not None else '?'} to"
            f" {human_seconds(high) if high is not None else 'unknown'}")
    return f"starts in {band} ({eta.get('method', '')})"


def _backend_eta(eta: dict[str, Any] | None) -> list[str]:
    """For a job its backend holds: shardctl's own band and the backend's estimate side by side, then
    how both were obtained."""
    eta = eta or {}
    low, high, start = eta.get("earliest_s"), eta.get("latest_s"), eta.get("backend_start_s")
    if low is None and high is None:
        ours = "none (shardctl does not queue this backend's jobs)"
    elif low == 0 and high == 0:
        ours = "starts now"
    else:
        ours = (f"starts in {human_seconds(low) if low is not None else '?'} to"
                f" {human_seconds(high) if high is not None else 'unknown'}")
    theirs = f"starts in {human_seconds(start)}" if start is not None else "none given"
    lines = [f"  shardctl's band: {ours}", f"  the backend's estimate: {theirs}"]
    return [*lines, f"  ({eta['method']})"] if eta.get("method") else lines


def explanation_lines(job_id: int, data: dict[str, Any]) -> list[str]:
    """`GET /v1/jobs/{id}/explain` as lines a person reads: the verdict, each reason with its numbers,
    the position, who is ahead (other teams only counted), the ETA band; for a job its backend holds
    (`backend_pending`), shardctl's band and the backend's own start estimate side by side."""
    status = data.get("status", "?")
    if data.get("note"):
        lines = [f"job {job_id} ({status}): {data['note']}"]
    elif data.get("admitted"):
        lines = [f"job {job_id} ({status}): admitted" + (f" to pool {data['pool']}" if data.get("pool") else "")
                 + "; the dispatcher submits it next cycle"]
    else:
        lines = [f"job {job_id} ({status}) waits:"]
    for r in data.get("reasons", []):
        numbers = ", ".join(f"{k} {r[k]}" for k in ("requested", "available", "limit") if r.get(k) is not None)
        lines.append(f"  {r['code']}: {r['message']}" + (f" [{numbers}]" if numbers else ""))
    position = data.get("position") or {}
    if position:
        lines.append(f"  position: {position.get('team', '?')} in its team, {position.get('pool', '?')} for its pools")
    ahead = data.get("ahead") or []
    if ahead and data.get("ahead_scope") == "every_team":  # an admin: every team's jobs, each named with its team
        lines.append("  ahead: " + ", ".join(
            f"job {a['job_id']} of {a['team']} ({a['gpus']} GPUs, priority {a['priority']})" for a in ahead))
    elif ahead:
        lines.append("  ahead from your team: " + ", ".join(
            f"job {a['job_id']} ({a['gpus']} GPUs, priority {a['priority']})" for a in ahead))
    others = data.get("ahead_other_teams") or {}
    if others.get("jobs"):
        lines.append(f"  ahead from other teams: {others['jobs']} jobs, {others.get('gpus', 0)} GPUs")
    if any(r.get("code") == "backend_pending" for r in data.get("reasons", [])) and data.get("eta"):
        return lines + _backend_eta(data["eta"])
    eta = _eta(data.get("eta"))
    if eta and not data.get("note"):
        lines.append(f"  {eta}")
    return lines


def why(job_id: Annotated[int, typer.Argument(help="The job's id.")], as_json: JsonOpt = False) -> None:
    """Why a job waits: the limit that holds it, with numbers, its position, who is ahead, an ETA band."""
    data = _call("GET", f"/v1/jobs/{job_id}/explain")
    if as_json:
        console.out(json.dumps(data, indent=2))
        return
    for line in explanation_lines(job_id, data):
        console.out(line, highlight=False)


@pools_app.command("list")
def pools_list(as_json: JsonOpt = False) -> None:
    """Every pool in effect, with its size and use."""
    pools = _call("GET", "/v1/pools")
    if as_json:
        console.out(json.dumps(pools, indent=2))
        return
    table = Table("pool", "backend", "gpu", "gpus", "in use", "free", "waiting", "source", box=None)
    for p in pools:
        table.add_row(p["name"], p["backend"], p["gpu"], str(p["gpus"]), str(p["in_use"]), str(p["free"]),
                      f"{p['waiting_jobs']} jobs / {p['waiting_gpus']} GPUs", p["source"])
    console.print(table)


@pools_app.command("set")
def pools_set(name: Annotated[str, typer.Argument(help="The pool's name (a DNS label).")],
              backend: Annotated[str, typer.Option(help="local, slurm or kubernetes.")],
              gpu: Annotated[str, typer.Option(help="The GPU kind as specs name it (or cpu).")],
              gpus: Annotated[int, typer.Option(help="How many GPUs (or cpu slots).")],
              partition: Annotated[str | None, typer.Option(help="Slurm partition.")] = None,
              namespace: Annotated[str | None, typer.Option(help="Kubernetes namespace.")] = None,
              preemption: Annotated[str | None, typer.Option(help="never, reclaim or lower_priority.")] = None,
              as_json: JsonOpt = False) -> None:
    """Declare or replace a pool (admin)."""
    body: dict[str, Any] = {"backend": backend, "gpu": gpu, "gpus": gpus}
    for key, value in (("partition", partition), ("namespace", namespace), ("preemption", preemption)):
        if value is not None:
            body[key] = value
    pool = _call("PUT", f"/v1/pools/{quote(name, safe='')}", json=body)
    if as_json:
        console.out(json.dumps(pool, indent=2))
    else:
        console.out(f"pool {pool['name']}: {pool['gpu']} x {pool['gpus']} on {pool['backend']}", highlight=False)


@pools_app.command("rm")
def pools_rm(name: Annotated[str, typer.Argument(help="The pool's name.")]) -> None:
    """Remove a declared pool (admin). Jobs admitted to it run on."""
    _call("DELETE", f"/v1/pools/{quote(name, safe='')}")
    console.out(f"removed pool {name}", highlight=False)


@quota_app.command("get")
def quota_get(team: str, as_json: JsonOpt = False) -> None:
    """A team's quota (admins any team, members their own)."""
    data = _call("GET", f"/v1/teams/{quote(team, safe='')}/quota")
    if as_json:
        console.out(json.dumps(data, indent=2))
        return
    q = data["quota"]
    head = "" if data["declared"] else " (none declared: it owns nothing and borrows what is free)"
    console.out(f"team {data['team']}{head}: weight {q['weight']}, max priority {q['max_priority']}"
                + (f", group {q['group']}" if q.get("group") else ""), highlight=False)
    for kind, f in sorted(q["flavors"].items()):
        borrow = "no limit" if f.get("borrowing_limit") is None else f["borrowing_limit"]
        lend = "all unused" if f.get("lending_limit") is None else f["lending_limit"]
        console.out(f"  {kind}: nominal {f['nominal']}, may borrow {borrow}, lends {lend}", highlight=False)


@quota_app.command("set")
def quota_set(team: str,
              file: Annotated[Path, typer.Option("--file", "-f", help="The quota as YAML or JSON, e.g. {weight: 1,"
                                                 " max_priority: 100, flavors: {H100-SXM-80GB: {nominal: 16}}}.")],
              as_json: JsonOpt = False) -> None:
    """Declare or replace a team's quota (admin)."""
    try:
        body = yaml.safe_load(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        print_error(err, f"{file}: cannot read the quota: {exc}")
        raise typer.Exit(EXIT_ERROR) from None
    data = _call("PUT", f"/v1/teams/{quote(team, safe='')}/quota", json=body)
    if as_json:
        console.out(json.dumps(data, indent=2))
    else:
        console.out(f"quota of team {data['team']} set", highlight=False)


def usage(team: str, since: Annotated[str | None, typer.Option(help="ISO 8601 time; default 7 days ago.")] = None,
          as_json: JsonOpt = False) -> None:
    """A team's GPU-seconds per kind since a time, GPUs admitted and borrowed now, and what waits."""
    data = _call("GET", f"/v1/teams/{quote(team, safe='')}/usage", params={"since": since} if since else {})
    if as_json:
        console.out(json.dumps(data, indent=2))
        return
    console.out(f"team {data['team']} since {data['since']}:", highlight=False)
    kinds = sorted(set(data["gpu_seconds"]) | set(data["admitted"]) | set(data["waiting"]))
    for kind in kinds:
        waiting = data["waiting"].get(kind, {"jobs": 0, "gpus": 0})
        hours = data["gpu_seconds"].get(kind, 0) / 3600
        console.out(f"  {kind}: {hours:.2f} GPU-hours; now {data['admitted'].get(kind, 0)} admitted"
                    f" ({data['borrowed'].get(kind, 0)} borrowed), {waiting['jobs']} jobs waiting for"
                    f" {waiting['gpus']}", highlight=False)
    if not kinds:
        console.out("  nothing used, admitted or waiting", highlight=False)


def register(app: typer.Typer) -> None:
    """Add `why`, `usage`, `pools ...` and `quota ...` to the `shardctl` app."""
    app.command("why")(why)
    app.command("usage")(usage)
    app.add_typer(pools_app, name="pools")
    app.add_typer(quota_app, name="quota")


__all__ = ["explanation_lines", "register"]
