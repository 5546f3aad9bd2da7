"""`shardctl webhooks add|list|rm|rotate|deliveries|redeliver` and `shardctl events [JOB] [--follow]`:
notifications through the API (docs/notifications.md)."""

from __future__ import annotations

import json
from typing import Annotated, Any
from urllib.parse import quote

import httpx
import typer
from rich.table import Table

from service.cli import control
from service.cli.client import Api, CliError, error_from_response
from service.cli.control import JsonOpt, console, fail, out_json

webhooks_app = typer.Typer(help="Webhooks: signed HTTP notifications of job events.", no_args_is_help=True)


def _call(method: str, path: str, **kw: Any) -> Any:
    try:
        return Api().request(method, path, **kw)
    except CliError as exc:
        raise fail(exc) from None


def _hook(webhook_id: str) -> str:
    return f"/v1/webhooks/{quote(webhook_id, safe='')}"


@webhooks_app.command("add")
def webhooks_add(
        url: Annotated[str, typer.Argument(help="Where to POST: http(s), not a private address unless the operator"
                                                " allows it.", show_default=False)],
        event: Annotated[list[str] | None, typer.Option(
            "--event", "-e", help="An event type (job.succeeded, job.failed, ...); repeat. Default: all.")] = None,
        description: Annotated[str, typer.Option(help="What it is for.")] = "",
        fmt: Annotated[str, typer.Option("--format", help="json (signed event document) or slack.")] = "json",
        team: Annotated[str | None, typer.Option(help="Admins: only this team's events (default: every team).")]
        = None,
        as_json: JsonOpt = False) -> None:
    """Subscribe URL to events. The signing secret is printed this once: keep it."""
    body: dict[str, Any] = {"url": url, "events": event or ["*"], "description": description, "format": fmt}
    if team is not None:
        body["team"] = team
    hook = _call("POST", "/v1/webhooks", json=body)
    if as_json:
        return out_json(hook)
    console.out(f"webhook {hook['id']} -> {hook['url']} ({', '.join(hook['events'])})", highlight=False)
    console.out(f"secret {hook['secret']}  (shown once: verify deliveries with it)", highlight=False)


@webhooks_app.command("list")
def webhooks_list(as_json: JsonOpt = False) -> None:
    hooks = _call("GET", "/v1/webhooks")
    if as_json:
        return out_json(hooks)
    table = Table()
    for column in ("id", "team", "url", "events", "format", "state"):
        table.add_column(column, no_wrap=column == "id")
    for h in hooks:
        state = f"disabled: {h['disabled_reason']}" if h["disabled_at"] else "live"
        table.add_row(h["id"], h["team"] or "(all)", h["url"], ", ".join(h["events"]), h["format"], state)
    console.print(table)


@webhooks_app.command("rm")
def webhooks_rm(webhook_id: str) -> None:
    """Delete a subscription: nothing more is delivered to it."""
    _call("DELETE", _hook(webhook_id))
    console.out(f"deleted {webhook_id}", highlight=False)


@webhooks_app.command("rotate")
def webhooks_rotate(webhook_id: str, as_json: JsonOpt = False) -> None:
    """A new signing secret; the old one keeps signing beside it until the printed time."""
    rotated = _call("POST", _hook(webhook_id) + "/rotate")
    if as_json:
        return out_json(rotated)
    console.out(f"secret {rotated['secret']}  (shown once)", highlight=False)
    console.out(f"the previous secret also signs until {rotated['previous_secret_expires_at']}", highlight=False)


@webhooks_app.command("deliveries")
def webhooks_deliveries(webhook_id: str, limit: Annotated[int, typer.Option(help="How many, newest first.")] = 20,
                        as_json: JsonOpt = False) -> None:
    """The delivery attempts: status, latency, what the receiver answered."""
    page = _call("GET", _hook(webhook_id) + "/deliveries", params={"limit": limit})
    if as_json:
        return out_json(page["items"])
    table = Table()
    for column in ("at", "delivery", "event", "type", "attempt", "status", "ms", "outcome", "error / answer"):
        table.add_column(column)
    for d in page["items"]:
        latency = f"{d['latency_ms']:.0f}" if d["latency_ms"] is not None else ""
        table.add_row(d["at"][:19], d["id"], str(d["event_id"]), d["event_type"], str(d["attempt"]),
                      str(d["status_code"] or ""), latency, d["outcome"], d["error"] or d["response_excerpt"][:60])
    console.print(table)


@webhooks_app.command("redeliver")
def webhooks_redeliver(webhook_id: str, delivery_id: str) -> None:
    """Deliver that delivery's event again."""
    out = _call("POST", _hook(webhook_id) + f"/deliveries/{quote(delivery_id, safe='')}/redeliver")
    console.out(f"event {out['event_id']}: {out['state']}", highlight=False)


def _print(e: dict[str, Any], as_json: bool) -> None:
    if as_json:
        console.out(json.dumps(e), highlight=False)
    else:
        console.out(f"{e['at'][:19]}  {e['id']:>8}  job {e['job_id']:<6} {e['team']:<12} {e['kind']:<18}"
                    f" {e['message']}", highlight=False)


def events(job_id: Annotated[int | None, typer.Argument(help="Only this job's events (with --follow: until it"
                                                            " ends).")] = None,
           follow: Annotated[bool, typer.Option("--follow", "-f", help="Stream new events as they happen.")]
           = False,
           team: Annotated[str | None, typer.Option(help="Only this team's jobs.")] = None,
           kind: Annotated[str | None, typer.Option("--type", help="An event type, or a prefix ending in '.'"
                                                                   " (job.).")] = None,
           since: Annotated[int, typer.Option(help="Only events after this id (the cursor).")] = 0,
           as_json: JsonOpt = False) -> None:
    """Events of every job you may see (yours, or all for an admin), or of one job; --follow streams them."""
    if job_id is not None and team is None and kind is None and since == 0:
        return control.events(job_id, follow=follow, as_json=as_json)  # the job's own stream ends with it
    params: dict[str, Any] = {"since": since}
    for key, value in (("job", job_id), ("team", team), ("type", kind)):
        if value is not None:
            params[key] = value
    api = Api()
    try:
        if not follow:
            while True:
                page = api.request("GET", "/v1/events", params={**params, "limit": 500})
                for e in page["items"]:
                    _print(e, as_json)
                if not page["items"]:
                    return
                params["since"] = page["next_cursor"]
        with api.stream_lines("/v1/events/stream", params=params) as response:
            if response.status_code >= 400:
                response.read()
                raise error_from_response(response)
            data = None
            for line in response.iter_lines():
                if line.startswith("data: "):
                    data = json.loads(line[6:])
                elif line == "" and data:
                    if "error" in data:
                        raise CliError(data["error"]["message"])
                    _print(data, as_json)
                    data = None
    except httpx.TransportError as exc:
        raise fail(CliError(f"cannot reach the shardctl API at {api.url} ({exc})")) from None
    except CliError as exc:
        raise fail(exc) from None
