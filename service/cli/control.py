"""Commands that talk to the control plane: serve, submit, jobs, show, events, cancel, tokens, teams, db."""

from __future__ import annotations

import getpass
import json
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar
from urllib.parse import quote

import httpx
import pydantic
import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from service.cli import wiring
from service.cli.client import Api, CliError, api_url, error_from_response, error_from_verdict, write_config
from service.cli.render import (
    EXIT_ERROR,
    EXIT_UNREADABLE,
    human_seconds,
    print_error,
    print_problems,
    pydantic_problems,
    spec_error_message,
    unreadable_message,
)
from service.observability import counters
from service.observability.exposition import serve_metrics
from service.observability.logs import configure_logging
from service.planner import InvalidSpec
from service.settings import Settings, SettingsError, load_settings
from service.spec import load_spec

console = Console()
err = Console(stderr=True)

token_app = typer.Typer(help="API tokens: create, list, revoke.", no_args_is_help=True)
team_app = typer.Typer(help="Teams: create, list.", no_args_is_help=True)
db_app = typer.Typer(help="The database schema.", no_args_is_help=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]


T = TypeVar("T")


def _settings() -> Settings:
    """The settings from the environment, or each bad `SHARDCTL_*` variable on its own line and exit 1."""
    try:
        return load_settings()
    except SettingsError as exc:
        for line in str(exc).splitlines():
            print_error(err, line)
        raise typer.Exit(EXIT_ERROR) from None


def fail(exc: Exception) -> typer.Exit:
    """Print `error: ...` and return the exit to raise: the error's own code (`CliError.exit_code`) or 1."""
    print_error(err, str(exc))
    return typer.Exit(exc.exit_code if isinstance(exc, CliError) else EXIT_ERROR)


def read_spec(path: Path, load: Callable[[Path], T]) -> T:
    """`load(path)`, or the reason it failed on stderr and the exit: 3 for a file that cannot be read,
    1 for an invalid spec (one `field.path: message` line per problem, as `shardctl plan` prints them)."""
    try:
        return load(path)
    except pydantic.ValidationError as exc:
        prefix = ("layout",) if exc.title == "LayoutPins" else ()
        print_problems(err, str(path), pydantic_problems(exc, prefix))
        raise typer.Exit(EXIT_ERROR) from None
    except InvalidSpec as exc:
        print_problems(err, str(path), exc.problems)
        raise typer.Exit(EXIT_ERROR) from None
    except (OSError, UnicodeDecodeError) as exc:
        print_error(err, unreadable_message(path, exc), source=str(path))
        raise typer.Exit(EXIT_UNREADABLE) from None
    except ValueError as exc:
        print_error(err, spec_error_message(path, exc), source=str(path))
        raise typer.Exit(EXIT_ERROR) from None


def out_json(data: Any) -> None:
    console.out(json.dumps(data, indent=2, default=str))


def announce(settings: Settings, markup: str) -> None:
    """A line for whoever runs the server: on stderr as it is with text logs; with JSON logs, as a log
    line (`shardctl.cli`), so that every line on stderr parses."""
    if settings.log_format == "json":
        logging.getLogger("shardctl.cli").info(Text.from_markup(markup).plain)
    else:
        err.print(markup, soft_wrap=True, highlight=False)


def _store(settings: Settings, *, migrate: bool = True) -> wiring.Sessions:
    """`wiring.open_store`, or the one line that says why the database cannot be opened, and exit 1."""
    try:
        return wiring.open_store(settings, migrate=migrate)
    except wiring.StoreUnavailable as exc:
        print_error(err, str(exc))
        raise typer.Exit(EXIT_ERROR) from None


def _load_pools(settings: Settings, sessions: wiring.Sessions) -> None:
    """`wiring.load_pools` (SHARDCTL_POOLS_FILE), or the file's problem in one line, and exit 1."""
    from service.scheduling.config_file import PoolsFileError

    try:
        wiring.load_pools(settings, sessions)
    except (PoolsFileError, ValueError) as exc:
        print_error(err, f"SHARDCTL_POOLS_FILE: {exc}")
        raise typer.Exit(EXIT_ERROR) from None


def _backends(settings: Settings) -> dict[str, Any]:
    """`wiring.make_backends`, saying as whom local jobs run; or the one line that says why a backend
    cannot be used (SHARDCTL_LOCAL_RUN_AS), and exit 1."""
    try:
        backends = wiring.make_backends(settings)
    except ValueError as exc:
        print_error(err, str(exc))
        raise typer.Exit(EXIT_ERROR) from None
    if settings.local_run_as is not None:
        announce(settings, f"local jobs run as OS user {settings.local_run_as}")
    else:
        announce(settings, f"[yellow]local jobs run as this server's own OS user ({getpass.getuser()}): a job can"
                 " read the server's files and environment; set SHARDCTL_LOCAL_RUN_AS to run them as another user"
                 " (docs/security.md)[/]")
    return backends


def _sigterm_sets(stop: threading.Event) -> None:
    """SIGTERM (systemd, Kubernetes) sets `stop`, as Ctrl-C would: the process ends its work and exits 0."""
    import signal as signals

    signals.signal(signals.SIGTERM, lambda *_: stop.set())


def serve(host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
          port: Annotated[int, typer.Option(help="TCP port.")] = 8686,
          with_dispatcher: Annotated[bool, typer.Option(
              "--with-dispatcher", help="Also run the dispatcher in this process (the embedded default). With"
              " --workers N it runs once, in the parent process, beside the N API workers.")] = False,
          workers: Annotated[int, typer.Option(
              "--workers", min=1, max=64, help="API worker processes (more than 1 needs PostgreSQL).")] = 1,
          ) -> None:
    """Migrate the database and run the API. On an empty database, create a first admin token and save
    it in the CLI config file (mode 0600), whose path is printed (or, with SHARDCTL_BOOTSTRAP_ADMIN_TOKEN,
    make sure that admin token exists). Each API process bounds the connections clients hold open
    (SHARDCTL_HEADER_TIMEOUT_S, SHARDCTL_KEEPALIVE_TIMEOUT_S, SHARDCTL_MAX_CONNECTIONS_PER_CLIENT,
    SHARDCTL_MAX_CONNECTIONS). On SIGTERM: stop accepting, finish the requests in flight (at
    most SHARDCTL_SHUTDOWN_GRACE_S), stop the dispatcher, give back its leases, exit 0 (docs/server.md)."""
    import uvicorn

    from service.cli.connections import guarded_protocol, limits_from

    settings = _settings()
    configure_logging(settings.log_format, settings.log_level)
    if workers > 1 and settings.resolved_database_url.startswith("sqlite"):
        print_error(err, f"--workers {workers} needs PostgreSQL: SQLite takes its one write lock for every"
                    " transaction, so more processes only queue behind it; set SHARDCTL_DATABASE_URL="
                    "postgresql+psycopg://USER:PASSWORD@HOST:5432/DB, or serve with --workers 1")
        raise typer.Exit(EXIT_ERROR)
    sessions = _store(settings)
    url, chosen = wiring.resolve_public_url(settings, host, port)
    if settings.bootstrap_admin_token is not None:
        try:
            state = wiring.ensure_bootstrap_admin(sessions, settings.bootstrap_admin_token.get_secret_value())
        except wiring.BootstrapRefused as exc:
            print_error(err, str(exc))
            raise typer.Exit(EXIT_ERROR) from None
        if state == "revoked":
            announce(settings, "[yellow]SHARDCTL_BOOTSTRAP_ADMIN_TOKEN names a revoked token: it stays revoked;"
                     " unset it, or set a new one[/]")
    elif wiring.needs_first_admin(sessions):
        # The token goes to the CLI config (created 0600), never to stderr: a server's stderr ends up in
        # journals and log collectors that other people read.
        secret = wiring.bootstrap_admin(sessions, "first admin (serve)")
        path = write_config(url=wiring.local_url(host, port), token=secret)
        announce(settings, f"[bold]First start: an admin token was created and saved to {path}[/] (mode 0600;"
                 " the CLI of this user on this machine uses it; read its \"token\" field to use it elsewhere)")
    _load_pools(settings, sessions)
    database = wiring.database_place(settings.resolved_database_url)
    announce(settings, f"shardctl API on http://{host}:{port} ({workers} worker{'s' if workers > 1 else ''};"
             f" database: {database}); jobs call back on {url}" + (f" ({chosen})" if chosen else ""))
    backends = _backends(settings)
    stop = threading.Event()
    _sigterm_sets(stop)  # uvicorn takes SIGTERM while it serves and raises it again here once it has stopped
    dispatcher_thread = None
    if with_dispatcher:
        dispatcher = wiring.make_dispatcher(settings, sessions, backends, public_url=url)
        dispatcher_thread = threading.Thread(target=dispatcher.run_forever, args=(stop, settings.dispatcher_interval_s),
                                             daemon=True, name="dispatcher")
        dispatcher_thread.start()
        wiring.start_notifier(settings, sessions, stop)  # webhook deliveries, on their own threads
        announce(settings, f"dispatcher {dispatcher.config.owner} running in this process (backends:"
                 f" {', '.join(sorted(backends))})")
    # Our access log (service.api.access_log) replaces uvicorn's; uvicorn's own lines go through ours.
    # No proxy-header rewriting: the client address stays the TCP peer, which forwarded identity checks.
    options: dict[str, Any] = dict(host=host, port=port, log_level="warning", log_config=None, access_log=False,
                                   proxy_headers=False, timeout_keep_alive=settings.keepalive_timeout_s,
                                   timeout_graceful_shutdown=max(1, round(settings.shutdown_grace_s)))
    limits, warning = limits_from(settings)
    if warning is not None:
        announce(settings, f"[yellow]{warning}[/]")
    try:
        if workers == 1:
            uvicorn.run(wiring.make_app(settings, sessions, backends, public_url=url, load=False),
                        http=guarded_protocol(limits), **options)
        else:
            from service.cli.serve_workers import PortInUse, serve_workers

            os.environ["SHARDCTL_PUBLIC_URL"] = url  # what each worker's app previews and tells jobs
            try:
                status = serve_workers("service.cli.wiring:app_factory", factory=True, workers=workers,
                                       limits=limits, **options)
            except PortInUse as exc:
                print_error(err, str(exc))
                raise typer.Exit(EXIT_ERROR) from None
            if status:
                raise typer.Exit(status)
    finally:
        stop.set()
        if dispatcher_thread is not None:
            released = wiring.stop_dispatcher(sessions, dispatcher.config.owner, stop, dispatcher_thread,
                                              settings.shutdown_grace_s)
            announce(settings, f"dispatcher stopped; {released} leased job(s) given back to the queue")


def worker(once: Annotated[bool, typer.Option("--once", help="Run one cycle and exit.")] = False) -> None:
    """Run the dispatcher: lease queued jobs, submit them, keep their status true. Run any number of
    replicas against PostgreSQL. On SIGTERM: let the current cycle end (at most SHARDCTL_SHUTDOWN_GRACE_S),
    give back the jobs it leased and did not submit, exit 0."""
    settings = _settings()
    configure_logging(settings.log_format, settings.log_level)
    sessions = _store(settings)
    _load_pools(settings, sessions)
    dispatcher = wiring.make_dispatcher(settings, sessions, _backends(settings))
    if once:
        report = dispatcher.run_once()
        notifier = wiring.make_notifier(settings, dispatcher.sessions)  # deliver what is due, then exit
        notifier.run_once()
        notifier.close()
        console.out(json.dumps({"submitted": report.submitted, "adopted": report.adopted,
                                "transitions": report.transitions, "unreachable": report.unreachable}))
        return
    stop = threading.Event()
    _sigterm_sets(stop)
    announce(settings, f"dispatcher {dispatcher.config.owner} on"
             f" {wiring.database_place(settings.resolved_database_url)}")
    if settings.dispatcher_metrics_port is not None:
        server = serve_metrics(counters.REGISTRY, host=settings.dispatcher_metrics_host,
                               port=settings.dispatcher_metrics_port, team_labels=settings.metrics_team_labels)
        announce(settings, f"dispatcher metrics on http://{settings.dispatcher_metrics_host}:{server.server_port}"
                 "/metrics")
    wiring.start_notifier(settings, dispatcher.sessions, stop)  # webhook deliveries, on their own threads
    thread = threading.Thread(target=dispatcher.run_forever, args=(stop, settings.dispatcher_interval_s),
                              daemon=True, name="dispatcher")
    thread.start()
    try:
        while not stop.wait(0.5):  # the main thread waits, so that signals reach it
            if not thread.is_alive():
                break
    except KeyboardInterrupt:
        pass
    released = wiring.stop_dispatcher(sessions, dispatcher.config.owner, stop, thread, settings.shutdown_grace_s)
    announce(settings, f"dispatcher {dispatcher.config.owner} stopped; {released} leased job(s) given back to"
             " the queue")


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
            secret = wiring.bootstrap_admin(_store(_settings()), name or "admin (cli)")
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
    table = Table()
    table.add_column("id", no_wrap=True, min_width=16)  # whole, to copy; `token revoke` takes a prefix too
    for column in ("role", "team", "name", "created", "expires", "revoked"):
        table.add_column(column)
    for r in rows:
        table.add_row(r["id"], r["role"], r["team"] or "", r["name"] or "", r["created_at"][:19],
                      (r["expires_at"] or "")[:19], (r["revoked_at"] or "")[:19])
    console.print(table)


@token_app.command("revoke")
def token_revoke(token_id: Annotated[str, typer.Argument(
        help="The token's id, or a unique prefix of it (4 characters at least), as `token list` shows.")]) -> None:
    """Revoke a token (idempotent)."""
    try:
        row = Api().request("POST", f"/v1/tokens/{quote(token_id, safe='')}/revoke")
    except CliError as exc:
        raise fail(exc) from None
    console.out(f"revoked {row['id']}" + (f" ({row['name']})" if row.get("name") else ""))


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

    settings = _settings()
    _store(settings).kw["bind"].dispose()  # migrates (a new SQLite file is created 0600 first), or one line why not
    console.out(f"database at revision {migrate.current_revision(settings.resolved_database_url)}")


def submit(spec_path: Annotated[Path, typer.Argument(help="Spec file (YAML or JSON).", show_default=False)],
           idempotency_key: Annotated[str | None, typer.Option(help="Retry-safe submission key.")] = None,
           dry_run: Annotated[bool, typer.Option("--dry-run", help="Plan and show the backend request; queue"
                                                 " nothing.")] = False,
           as_json: JsonOpt = False) -> None:
    """Plan and queue a job through the API.

    Exit codes (with --dry-run, the ones the submission would give):
      0  queued (with --dry-run: it would be queued)
      1  an invalid spec (a `field.path: message` line per problem), or an error
      2  no layout fits
      3  the spec file does not exist or cannot be read
    Problems the API finds in the spec print as `shardctl plan` prints them.
    """
    spec = read_spec(spec_path, load_spec)
    body = spec.model_dump(mode="json", exclude_unset=True)
    if dry_run:
        preview = api_call(spec_path, "POST", "/v1/plans", json=body)
        if as_json:
            out_json(preview)
        else:
            from service.cli.render import plan_panel
            from service.planner import Plan

            launch = preview.get("launch")
            shown = {k: v for k, v in preview.items() if k not in ("launch", "verdict")}
            console.print(plan_panel(Plan.model_validate(shown), console.width))
            if launch:
                console.out(json.dumps(launch, indent=2))
            elif (preview.get("verdict") or {}).get("submittable"):
                console.out("(no dispatcher for this backend on the server)")
        refused = error_from_verdict(preview)
        if refused is not None:
            raise refusal_exit(spec_path, refused)
        return
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
    job = api_call(spec_path, "POST", "/v1/jobs", json=body, headers=headers)
    if as_json:
        return out_json(job)
    console.out(f"job {job['id']} {job['status']}: {job['name']} ({job['team']}) {job['layout']},"
                f" predicted {human_seconds(job['predicted_step_s'] or 0)}/step")


def api_call(spec_path: Path, method: str, path: str, **kw: Any) -> Any:
    """`Api().request(...)` for a spec: a spec the API refuses prints as `shardctl plan` prints one
    (`spec.yaml: invalid spec`, then `  field.path: message` lines); other errors as `fail` does."""
    try:
        return Api().request(method, path, **kw)
    except CliError as exc:
        raise refusal_exit(spec_path, exc) from None


def refusal_exit(spec_path: Path, exc: CliError) -> typer.Exit:
    """Print the API's refusal of a spec (as `shardctl plan` prints an invalid one, or as `fail` does)
    and return the exit to raise: a submission and its dry run end alike."""
    if exc.is_invalid_spec:
        print_problems(err, str(spec_path), exc.problems)
        return typer.Exit(EXIT_ERROR)
    return fail(exc)


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


def show(job_id: int, as_json: JsonOpt = False,
         brief: Annotated[bool, typer.Option("--brief", help="The plan in one line instead of its panel.")]
         = False) -> None:
    """A job: spec, plan, status, attempts, measurements."""
    try:
        job = Api().request("GET", f"/v1/jobs/{job_id}")
    except CliError as exc:
        raise fail(exc) from None
    if as_json:
        return out_json(job)
    from service.cli.render import attempt_lines, plan_line, plan_panel
    from service.planner import Plan

    console.out(f"job {job['id']} {job['name']} ({job['team']}): {job['status']} on {job['backend']}")
    for a in job["attempts"]:
        for line in attempt_lines(a):
            console.out(line, highlight=False)
    plan = Plan.model_validate(job["plan"])
    if brief:
        console.out(f"  plan {plan_line(plan)}", highlight=False)
    else:
        console.print(plan_panel(plan, console.width))
    measurements = job["measurements"]
    if "report" in measurements:
        console.print(measured_table(measurements["report"]["data"]))
    if job.get("prediction_error"):
        from service.cli.calibrate import prediction_error_line

        console.out(prediction_error_line(job["prediction_error"]), highlight=False)
    if "profile" in measurements:
        diagnosis = measurements["profile"]["data"].get("diagnosis") or {}
        console.out(f"Profile verdict: {diagnosis.get('bound', '?')} ({diagnosis.get('confidence', '?')} confidence)")
        if diagnosis.get("plan"):
            console.out(f"  {diagnosis['plan']['text']}")
        for rec in diagnosis.get("recommendations", [])[:3]:
            console.out(f"  {rec.get('id')}: {rec.get('text')}")
    elif "heartbeat" in measurements:
        console.out(f"last heartbeat: {json.dumps(measurements['heartbeat']['data'])}")
    if not measurements:
        console.out("no measurements reported" + (" yet" if job["status"] in ("QUEUED", "SUBMITTING", "PENDING",
                                                                              "RUNNING") else ""))


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
                raise error_from_response(response)
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
