"""`shardctl logs` and `shardctl artifacts`: a job's output and files, as the API reads them from the backend.

`shardctl logs JOB` prints what the job's latest attempt printed so far (every page of
`GET /v1/jobs/{id}/logs`); `-f` follows it live (Server-Sent Events) until the attempt ends, and
reconnects after a dropped connection from the last line it printed (`Last-Event-ID`), so nothing is
printed twice or skipped. Lines of all ranks are merged, each behind `[rank N]` (`[launcher]` for the
launcher's own lines), unless `--rank` picks one. `--json` prints the API's objects, one per line.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.table import Table

from service.cli.client import Api, CliError, error_from_response

console = Console()
err = Console(stderr=True)

#: Reconnections `logs -f` makes after the connection drops, before it gives up.
RECONNECTS = 5
PAGE = 5000

RankOpt = Annotated[int | None, typer.Option("--rank", "-r", min=0, help="Only this global rank's lines.")]
AttemptOpt = Annotated[int | None, typer.Option("--attempt", "-a", min=1, help="The attempt (default: the latest).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the API's JSON objects, one per line.")]


def _fail(exc: Exception) -> typer.Exit:
    err.print(f"[red]error:[/red] {exc}", markup=True, highlight=False)
    return typer.Exit(exc.exit_code if isinstance(exc, CliError) else 1)


def format_line(item: dict[str, Any], *, merged: bool) -> str:
    """One line as the terminal shows it: behind its rank when ranks are merged."""
    if not merged:
        return str(item["line"])
    who = "launcher" if item.get("rank") is None else f"rank {item['rank']}"
    return f"[{who}] {item['line']}"


def _emit(item: dict[str, Any], *, merged: bool, as_json: bool) -> None:
    sys.stdout.write((json.dumps(item) if as_json else format_line(item, merged=merged)) + "\n")
    sys.stdout.flush()


def _get(api: Api, path: str, params: dict[str, Any]) -> httpx.Response:
    try:
        response = api.http.get(path, params=params)
    except httpx.TransportError as exc:
        raise CliError(f"cannot reach the shardctl API at {api.url} ({exc}); start it with `shardctl serve`"
                       " or set SHARDCTL_URL") from exc
    if response.status_code >= 400:
        raise error_from_response(response)
    return response


def print_pages(api: Api, job_id: int, *, rank: int | None, attempt: int | None, as_json: bool) -> None:
    params: dict[str, Any] = {"limit": PAGE}
    params.update({k: v for k, v in (("rank", rank), ("attempt", attempt)) if v is not None})
    while True:
        rows = [json.loads(x) for x in _get(api, f"/v1/jobs/{job_id}/logs", params).text.splitlines() if x]
        *lines, end = rows
        for item in lines:
            _emit(item, merged=rank is None, as_json=as_json)
        if not lines or end.get("finished") or end.get("next_cursor") is None:
            return
        params["cursor"] = end["next_cursor"]


def follow(api: Api, job_id: int, *, rank: int | None, attempt: int | None, as_json: bool) -> None:
    """Print the live stream until its `end`; reconnect from the last event id after a dropped connection."""
    params: dict[str, Any] = {"follow": "true"}
    params.update({k: v for k, v in (("rank", rank), ("attempt", attempt)) if v is not None})
    last_id: str | None = None
    failures = 0
    while True:
        headers = {"Last-Event-ID": last_id} if last_id else {}
        try:
            with api.http.stream("GET", f"/v1/jobs/{job_id}/logs", params=params, headers=headers,
                                 timeout=httpx.Timeout(30.0, read=None)) as response:
                if response.status_code >= 400:
                    response.read()
                    raise error_from_response(response)
                kind, event_id = None, None
                for raw in response.iter_lines():
                    if raw.startswith("event: "):
                        kind = raw[7:]
                    elif raw.startswith("id: "):
                        event_id = raw[4:]
                    elif raw.startswith("data: "):
                        data = json.loads(raw[6:])
                        if kind == "line":
                            _emit(data, merged=rank is None, as_json=as_json)
                            last_id, failures = event_id or last_id, 0
                        elif kind == "end":
                            return
                        elif kind == "error":
                            error = data.get("error") or {}
                            raise CliError(f"{error.get('message')} ({error.get('code')})")
                    elif raw == "":
                        kind, event_id = None, None
        except httpx.TransportError as exc:
            failures += 1
            if failures > RECONNECTS:
                raise CliError(f"lost the log stream from {api.url} ({exc}); run the command again") from exc
            time.sleep(min(2.0 ** failures / 4, 5.0))
            continue
        # the server closed the stream without an `end` (it restarted): resume from the last line
        failures += 1
        if failures > RECONNECTS:
            raise CliError(f"the log stream from {api.url} kept closing; run the command again")
        time.sleep(min(2.0 ** failures / 4, 5.0))


def logs(job_id: int,
         follow_: Annotated[bool, typer.Option("--follow", "-f", help="Follow live until the attempt ends.")] = False,
         rank: RankOpt = None, attempt: AttemptOpt = None, as_json: JsonOpt = False) -> None:
    """What a job printed: all ranks merged behind their rank, or one rank (`--rank`)."""
    api = Api()
    try:
        if follow_:
            follow(api, job_id, rank=rank, attempt=attempt, as_json=as_json)
        else:
            print_pages(api, job_id, rank=rank, attempt=attempt, as_json=as_json)
    except CliError as exc:
        raise _fail(exc) from None


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def artifacts(job_id: int, attempt: AttemptOpt = None,
              get: Annotated[str | None, typer.Option("--get", help="Download this file (a path as listed).")]
              = None,
              output: Annotated[Path | None, typer.Option("--output", "-o", help="Where --get writes (default:"
                                                          " the file's name here; '-' for stdout).")] = None,
              as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """The files a job wrote to its output folder (checkpoints, traces, the report); `--get` downloads one."""
    api = Api()
    params = {"attempt": attempt} if attempt is not None else {}
    try:
        if get is not None:
            data = _get(api, f"/v1/jobs/{job_id}/artifacts/{get.lstrip('/')}", params).content
            if output is not None and str(output) == "-":
                sys.stdout.buffer.write(data)
                return
            target = output or Path(get.rsplit("/", 1)[-1])
            target.write_bytes(data)
            err.print(f"wrote {target} ({_size(len(data))})", highlight=False)
            return
        listing = api.request("GET", f"/v1/jobs/{job_id}/artifacts", params=params)
    except CliError as exc:
        raise _fail(exc) from None
    if as_json:
        console.out(json.dumps(listing))
        return
    if not listing["artifacts"]:
        console.out(f"job {job_id}: no files" + (f" (attempt {listing['attempt']})" if listing["attempt"] else
                                                 " (no attempt yet)"))
        return
    table = Table("path", "size", "modified", title=f"job {job_id}, attempt {listing['attempt']}")
    for item in listing["artifacts"]:
        table.add_row(item["path"], _size(item["size"]), item["modified"][:19].replace("T", " "))
    console.print(table)
