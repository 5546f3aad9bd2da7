"""Commands that talk to the control plane: serve, submit, jobs, show, events, cancel, tokens, teams, db."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.table import Table

from service.cli.client import Api, CliError, api_url, write_config
from service.cli.render import human_seconds
from service.settings import Settings
from service.spec import load_spec

console = Console()
err = Console(stderr=True)

token_app = typer.Typer(help="API tokens: create, list, revoke.", no_args_is_help=True)
team_app = typer.Typer(help="Teams: create, list.", no_args_is_help=True)
db_app = typer.Typer(help="The database schema.", no_args_is_help=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]


def fail(exc: Exception) -> typer.Exit:
    err.print(f"[bold red]error:[/] {exc}")
    return typer.Exit(1)


def out_json(data: Any) -> None:
    console.out(json.dumps(data, indent=2, default=str))


def _sessions(settings: Settings) -> Any:
    """A sessionmaker on the database `settings` names, migrated first (one engine per process)."""
    from service.store import migrate
    from service.store.db import make_engine, make_sessionmaker

    migrate.upgrade(settings.resolved_database_url)
    return make_sessionmaker(make_engine(settings.resolved_database_url))


def _bootstrap_admin(sessions: Any, name: str) -> str:
    """Create an admin token directly in the database (first start); returns its secret."""
    from service.store.tokens import create_token

    with sessions.begin() as session:
        _, secret = create_token(session, role="admin", name=name)
    return secret


def serve(host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
          port: Annotated[int, typer.Option(help="TCP port.")] = 8686,
          with_dispatcher: Annotated[bool, typer.Option(
              "--with-dispatcher", help="Also run the dispatcher in this process (the embedded default).")] = False,
          ) -> None:
    """Migrate the database and run the API. On an empty database, print a first admin token once."""
    import uvicorn

    from service.api.app import create_app
    from service.store.tokens import has_admin
    from workers.backends.registry import make_backends
    from workers.dispatcher import launch_preview

    settings = Settings()
    sessions = _sessions(settings)
    engine = sessions.kw["bind"]
    with sessions.begin() as session:
        empty = not has_admin(session)
    url = f"http://{host}:{port}"
    if empty:
        secret = _bootstrap_admin(sessions, "first admin (serve)")
        path = write_config(url=url, token=secret)
        err.print(f"[bold]First start: admin token (shown once, saved to {path}):[/]\n{secret}")
    err.print(f"shardctl API on {url} (database: {settings.resolved_database_url.split('@')[-1]})")
    backends = make_backends(settings)
    stop = threading.Event()
    if with_dispatcher:
        thread = threading.Thread(target=_dispatcher(settings, sessions, backends, public_url=url).run_forever,
                                  args=(stop, settings.dispatcher_interval_s), daemon=True, name="dispatcher")
        thread.start()
        err.print("dispatcher running in this process")
    preview = launch_preview(backends, url)
    try:
        uvicorn.run(create_app(settings, engine=engine, launch_preview=preview), host=host, port=port,
                    log_level="warning")
    finally:
        stop.set()


def _dispatcher(settings: Settings, sessions: Any, backends: Any, public_url: str | None = None) -> Any:
    from workers.dispatcher import Dispatcher, DispatcherConfig

    config = DispatcherConfig(lease_s=settings.dispatcher_lease_s, batch=settings.dispatcher_batch,
                              max_attempts=settings.max_attempts, retry_backoff_s=settings.retry_backoff_s,
                              api_url=public_url or settings.public_url)
    return Dispatcher(sessions, backends, config)


def worker(once: Annotated[bool, typer.Option("--once", help="Run one cycle and exit.")] = False) -> None:
    """Run the dispatcher: lease queued jobs, submit them, keep their status true. Run any number of
    replicas against PostgreSQL."""
    import signal as signals

    from workers.backends.registry import make_backends

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    settings = Settings()
    dispatcher = _dispatcher(settings, _sessions(settings), make_backends(settings))
    if once:
        report = dispatcher.run_once()
        console.out(json.dumps({"submitted": report.submitted, "adopted": report.adopted,
                                "transitions": report.transitions, "unreachable": report.unreachable}))
        return
    stop = threading.Event()
    signals.signal(signals.SIGTERM, lambda *_: stop.set())
    err.print(f"dispatcher {dispatcher.config.owner} on {settings.resolved_database_url.split('@')[-1]}")
    try:
        dispatcher.run_forever(stop, settings.dispatcher_interval_s)
    except KeyboardInterrupt:
        stop.set()


@token_app.command("create")
def token_create(
    admin: Annotated[bool, typer.Option("--admin", help="Bootstrap an admin token in the local database.")] = False,
    team: Annotated[str | None, typer.Option(help="Team of a member token.")] = None,
    role: Annotated[str, typer.Option(help="member | admin | job (through the API).")] = "member",
    name: Annotated[str | None, typer.Option(help="A label to recognise the token by.")] = None,
    expires_in: Annotated[int | None, typer.Option(help="Lifetime in seconds.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Create a token and print its secret once. `--admin` writes straight to the database (first
    start) and saves the token in the CLI config; otherwise an admin token calls the API."""
    try:
        if admin:
            secret = _bootstrap_admin(_sessions(Settings()), name or "admin (cli)")
            write_config(url=api_url(), token=secret)
            data: dict[str, Any] = {"token": secret}
        else:
            data = Api().request("POST", "/v1/tokens", json={
                "role": role, "team": team, "name": name, "expires_in_s": expires_in})
    except CliError as exc:
        raise fail(exc) from None
    if as_json:
        out_json({"token": data["token"]} if admin else data)
    else:
        console.out(data["token"])


@token_app.command("list")
def token_list(as_json: JsonOpt = False) -> None:
    try:
        rows = Api().request("GET", "/v1/tokens")
    except CliError as exc:
        raise fail(exc) from None
    if as_json:
        return out_json(rows)
    table = Table("id", "role", "team", "name", "created", "expires", "revoked")
    for r in rows:
        table.add_row(r["id"], r["role"], r["team"] or "", r["name"] or "", r["created_at"][:19],
                      (r["expires_at"] or "")[:19], (r["revoked_at"] or "")[:19])
    console.print(table)


@token_app.command("revoke")
def token_revoke(token_id: str) -> None:
    try:
        Api().request("POST", f"/v1/tokens/{token_id}/revoke")
    except CliError as exc:
        raise fail(exc) from None
    console.out(f"revoked {token_id}")


@team_app.command("create")
def team_create(name: str, as_json: JsonOpt = False) -> None:
    try:
        team = Api().request("POST", "/v1/teams", json={"name": name})
    except CliError as exc:
        raise fail(exc) from None
    out_json(team) if as_json else console.out(f"created team {team['name']}")


@team_app.command("list")
def team_list(as_json: JsonOpt = False) -> None:
    try:
        teams = Api().request("GET", "/v1/teams")
    except CliError as exc:
        raise fail(exc) from None
    if as_json:
        return out_json(teams)
    for t in teams:
        console.out(t["name"])


@db_app.command("upgrade")
def db_upgrade() -> None:
    """Apply every migration to the database SHARDCTL_DATABASE_URL names (default: the SQLite file)."""
    from service.store import migrate

    url = Settings().resolved_database_url
    migrate.upgrade(url)
    console.out(f"database at revision {migrate.current_revision(url)}")


def submit(spec_path: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="Spec file.")],
           idempotency_key: Annotated[str | None, typer.Option(help="Retry-safe submission key.")] = None,
           dry_run: Annotated[bool, typer.Option("--dry-run", help="Plan and show the backend request; queue"
                                                 " nothing.")] = False,
           as_json: JsonOpt = False) -> None:
    """Plan and queue a job through the API."""
    try:
        spec = load_spec(spec_path)
    except Exception as exc:
        raise fail(exc) from None
    if dry_run:
        try:
            preview = Api().request("POST", "/v1/plans", json=spec.model_dump(mode="json", exclude_unset=True))
        except CliError as exc:
            raise fail(exc) from None
        if as_json:
            return out_json(preview)
        from service.cli.render import plan_panel
        from service.planner import Plan

        launch = preview.pop("launch", None)
        console.print(plan_panel(Plan.model_validate(preview), console.width))
        console.out(json.dumps(launch, indent=2) if launch else "(no dispatcher for this backend on the server)")
        return
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
    try:
        job = Api().request("POST", "/v1/jobs", json=spec.model_dump(mode="json", exclude_unset=True),
                            headers=headers)
    except CliError as exc:
        raise fail(exc) from None
    if as_json:
        return out_json(job)
    console.out(f"job {job['id']} {job['status']}: {job['name']} ({job['team']}) {job['layout']},"
                f" predicted {human_seconds(job['predicted_step_s'] or 0)}/step")


def jobs(status: Annotated[list[str] | None, typer.Option("--status", help="Repeat for several.")] = None,
         team: Annotated[str | None, typer.Option()] = None,
         backend: Annotated[str | None, typer.Option()] = None,
         name: Annotated[str | None, typer.Option()] = None,
         limit: Annotated[int, typer.Option(min=1, max=200)] = 50,  # service.store.jobs.MAX_PAGE
         as_json: JsonOpt = False) -> None:
    """List jobs, newest first."""
    params: dict[str, Any] = {"limit": limit, "team": team, "backend": backend, "name": name}
    params = {k: v for k, v in params.items() if v is not None}
    if status:
        params["status"] = [s.upper() for s in status]
    try:
        page = Api().request("GET", "/v1/jobs", params=params)
    except CliError as exc:
        raise fail(exc) from None
    if as_json:
        return out_json(page)
    table = Table("id", "name", "team", "status", "backend", "layout", "step", "created")
    for j in page["items"]:
        table.add_row(str(j["id"]), j["name"], j["team"], j["status"], j["backend"], j["layout"],
                      human_seconds(j["predicted_step_s"] or 0), j["created_at"][:19])
    console.print(table)


def show(job_id: int, as_json: JsonOpt = False) -> None:
    """A job: spec, plan, status, attempts, measurements."""
    try:
        job = Api().request("GET", f"/v1/jobs/{job_id}")
    except CliError as exc:
        raise fail(exc) from None
    if as_json:
        return out_json(job)
    from service.cli.render import plan_panel
    from service.planner import Plan

    console.out(f"job {job['id']} {job['name']} ({job['team']}): {job['status']} on {job['backend']}")
    for a in job["attempts"]:
        nodes = ", ".join(a["nodes"])
        console.out(f"  attempt {a['number']} {a['backend_name']} {a['status']}"
                    f"{' on ' + nodes if nodes else ''} {a['exit_reason'] or ''}".rstrip())
    console.print(plan_panel(Plan.model_validate(job["plan"]), console.width))
    measurements = job["measurements"]
    if "report" in measurements:
        console.print(measured_table(measurements["report"]["data"]))
    if "profile" in measurements:
        diagnosis = measurements["profile"]["data"].get("diagnosis") or {}
        console.out(f"Profile verdict: {diagnosis.get('bound', '?')} ({diagnosis.get('confidence', '?')} confidence)")
        if diagnosis.get("plan"):
            console.out(f"  {diagnosis['plan']['text']}")
        for rec in diagnosis.get("recommendations", [])[:3]:
            console.out(f"  {rec.get('id')}: {rec.get('text')}")
    elif "heartbeat" in measurements:
        console.out(f"last heartbeat: {json.dumps(measurements['heartbeat']['data'])}")


def measured_table(report: dict[str, Any]) -> Table:
    """Prediction next to measurement, per memory component and for step time, as the runtime reported."""
    table = Table("", "predicted", "measured", "measured/predicted", title="Prediction vs measurement (per GPU)")
    predicted, measured, ratios = report.get("predicted", {}), report.get("measured", {}), report.get("ratios", {})
    rows = [("params", "params", "params", True), ("grads", "grads", "grads", True),
            ("optimizer", "optimizer", "optimizer", True), ("peak memory", "peak_allocated", "peak", True),
            ("step time", "step_s", "step_s", False), ("tokens/s", "tokens_per_s", "tokens_per_s", False)]
    for label, p_key, m_key, is_bytes in rows:
        p, m, r = predicted.get(p_key), measured.get(m_key), ratios.get(m_key)

        def fmt(v: Any, as_bytes: bool = is_bytes, key: str = p_key) -> str:
            if v is None:
                return "-"
            if as_bytes:
                return f"{v / 2**30:.3f} GiB"
            return human_seconds(v) if key == "step_s" else f"{v:,.0f}"

        table.add_row(label, fmt(p), fmt(m), f"{r:.3f}" if isinstance(r, int | float) else "-")
    return table


def events(job_id: int, follow: Annotated[bool, typer.Option("--follow", "-f", help="Stream until the job ends.")]
           = False, as_json: JsonOpt = False) -> None:
    """The job's event history, or a live stream of it."""
    api = Api()
    try:
        if not follow:
            for e in api.request("GET", f"/v1/jobs/{job_id}/events"):
                _print_event(e, as_json)
            return
        with api.stream_lines(f"/v1/jobs/{job_id}/events", params={"stream": "true"}) as response:
            if response.status_code >= 400:
                response.read()
                from service.cli.client import describe_error

                raise CliError(describe_error(response))
            data = None
            for line in response.iter_lines():
                if line.startswith("event: end"):
                    return
                if line.startswith("data: "):
                    data = json.loads(line[6:])
                elif line == "" and data:
                    _print_event(data, as_json)
                    data = None
    except httpx.TransportError as exc:
        raise fail(CliError(f"cannot reach the shardctl API at {api.url} ({exc})")) from None
    except CliError as exc:
        raise fail(exc) from None


def _print_event(e: dict[str, Any], as_json: bool) -> None:
    if as_json:
        console.out(json.dumps(e))
    else:
        console.out(f"{e['at'][:19]}  {e['kind']:<18} {e['actor']:<24} {e['message']}")


def cancel(job_id: int) -> None:
    """Cancel a job (idempotent)."""
    try:
        job = Api().request("POST", f"/v1/jobs/{job_id}/cancel")
    except CliError as exc:
        raise fail(exc) from None
    console.out(f"job {job['id']}: {job['status']}")
