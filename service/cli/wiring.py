"""Composition: the one place that builds the running system out of its parts.

The control plane (`service.*`) never imports `workers.*`: the API learns what the dispatcher can do
through what it is given (`launch_preview`, `configured_backends`). This module is the single
declared exception. It builds the store (engine, sessions, migrations), the first admin token, the
backends the settings enable, the dispatcher and the API app, so that `shardctl serve` and `shardctl
worker` only call it. `workers` is imported inside the functions that need it, so commands that build
nothing (`shardctl plan`, the API clients) never load it.
"""

from __future__ import annotations

import hmac
import logging
import re
import socket
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

from sqlalchemy.orm import Session, sessionmaker

from service.settings import Settings

if TYPE_CHECKING:
    from fastapi import FastAPI

    from workers.backends.base import Backend
    from workers.dispatcher import Dispatcher
    from workers.notify import Notifier

Sessions = sessionmaker[Session]


class StoreUnavailable(Exception):
    """The database the settings name cannot be opened. The message is one line for a person: where
    (host, port and database, or the SQLite file; never the password), the driver's error, and what to check."""


class BootstrapRefused(Exception):
    """SHARDCTL_BOOTSTRAP_ADMIN_TOKEN cannot be honoured; the message never holds the token."""


#: The advisory lock `open_store` holds on PostgreSQL while it migrates, so that replicas starting at
#: once migrate one after the other ("shardmig" as 8 bytes).
MIGRATE_LOCK_KEY = int.from_bytes(b"shardmig", "big") & 0x7FFF_FFFF_FFFF_FFFF


def database_place(url: str) -> str:
    """Where `url` points, for a message: `host:port/database`, or the SQLite file; never user or password."""
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except Exception:
        return "an unparsable URL"
    if parsed.get_backend_name() == "sqlite":
        return f"SQLite file {parsed.database or ':memory:'}"
    port = f":{parsed.port}" if parsed.port else ""
    return f"{parsed.get_backend_name()} at {parsed.host or 'localhost'}{port}/{parsed.database or ''}"


_HINTS = (
    (("connection refused",), "is the database server running and listening on that host and port?"),
    (("password authentication failed", "authentication failed", "no password supplied"),
     "check the user and password in SHARDCTL_DATABASE_URL"),
    (("does not exist",), "create that database (createdb) or fix its name in SHARDCTL_DATABASE_URL"),
    (("could not translate host name", "name or service not known", "nodename nor servname",
      "temporary failure in name resolution"), "check the host name in SHARDCTL_DATABASE_URL"),
    (("timeout", "timed out", "no route to host", "network is unreachable"),
     "is the host reachable from here (firewall, network policy)?"),
    (("unable to open database file", "permission denied", "read-only", "not a directory", "no such file"),
     "check that the folder exists and this user may write it (SHARDCTL_DATA_DIR)"),
    (("can't locate revision",), "the database was migrated by a newer shardctl; run that version"),
    (("could not parse", "can't load plugin", "no module named"),
     "use postgresql+psycopg://USER:PASSWORD@HOST:5432/DB or sqlite:////path/to/shardctl.db"),
)


def describe_database_error(url: str, exc: BaseException) -> str:
    """One line: which database, the driver's first line of error (credentials redacted), and what to check."""
    from service.redaction import redact_value

    cause = getattr(exc, "orig", None) or exc
    first = next((line.strip() for line in str(cause).splitlines() if line.strip()), type(cause).__name__)
    lowered = str(cause).lower()
    hint = next((h for needles, h in _HINTS if any(n in lowered for n in needles)), "check SHARDCTL_DATABASE_URL")
    return (f"cannot open the database ({database_place(url)}; SHARDCTL_DATABASE_URL): {redact_value(first)[:400]};"
            f" {hint}")


def _migrate(url: str) -> None:
    """`migrate.upgrade(url)`; on PostgreSQL under a session advisory lock, so concurrent starts take turns."""
    from sqlalchemy import create_engine, pool, text

    from service.store import migrate

    if not url.startswith("postgresql"):
        migrate.upgrade(url)
        return
    engine = create_engine(url, poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT pg_advisory_lock(:key)"), {"key": MIGRATE_LOCK_KEY})
            try:
                migrate.upgrade(url)
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": MIGRATE_LOCK_KEY})
    finally:
        engine.dispose()


def open_store(settings: Settings, *, migrate: bool = True) -> Sessions:
    """A sessionmaker on the database `settings` names (one engine per process; the engine is
    `sessions.kw["bind"]`), migrated first unless `migrate` is False (then only connected to once). A
    SQLite file is created 0600 before the migrations open it. A database that cannot be opened is a
    `StoreUnavailable` whose message is one line (`describe_database_error`), not a traceback."""
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)  # a line per plugin, at import
    from alembic.util import CommandError
    from sqlalchemy.exc import SQLAlchemyError

    from service.store.db import make_engine, make_sessionmaker, private_sqlite_file

    url = settings.resolved_database_url
    try:
        private_sqlite_file(url)
        if migrate:
            _migrate(url)
        engine = make_engine(url)
        if not migrate:
            with engine.connect():
                pass
    except (SQLAlchemyError, CommandError, OSError, ImportError) as exc:
        raise StoreUnavailable(describe_database_error(url, exc)) from None
    return make_sessionmaker(engine)


def needs_first_admin(sessions: Sessions) -> bool:
    """True on a database without a live admin token (a first start)."""
    from service.store.tokens import has_admin

    with sessions.begin() as session:
        return not has_admin(session)


def bootstrap_admin(sessions: Sessions, name: str) -> str:
    """Create an admin token directly in the database (first start); returns its secret."""
    from service.store.tokens import create_token
    from service.store.vocab import Role

    with sessions.begin() as session:
        _, secret = create_token(session, role=Role.ADMIN, name=name)
    return secret


#: The form SHARDCTL_BOOTSTRAP_ADMIN_TOKEN takes: a shardctl token whose id fits `api_tokens.id`.
BOOTSTRAP_TOKEN = re.compile(r"shc_[A-Za-z0-9]{8,32}_[A-Za-z0-9_-]{32,200}")
BOOTSTRAP_NAME = "bootstrap (SHARDCTL_BOOTSTRAP_ADMIN_TOKEN)"


def ensure_bootstrap_admin(sessions: Sessions, token: str) -> Literal["created", "present", "revoked"]:
    """Make sure the admin token `token` (`shc_<id>_<secret>`) exists: insert it when its id is new
    ("created"); nothing when it is there with this secret ("present"), or was revoked ("revoked": a
    revocation is an admin's decision and stays). Idempotent across restarts and concurrent replicas
    (the primary key picks one insert; the others read it). Raises `BootstrapRefused` for a value of
    another form, or an id that another token already holds; no message holds the secret."""
    from sqlalchemy.exc import IntegrityError

    from service.store.models import ApiToken
    from service.store.tokens import secret_hash
    from service.store.vocab import Role

    if BOOTSTRAP_TOKEN.fullmatch(token) is None:
        raise BootstrapRefused("SHARDCTL_BOOTSTRAP_ADMIN_TOKEN must be shc_<id>_<secret>: id 8 to 32 letters and"
                               " digits, secret 32 to 200 of [A-Za-z0-9_-] (the value is not shown)")
    _, token_id, secret = token.split("_", 2)
    digest = secret_hash(secret)
    for _ in range(2):
        try:
            with sessions.begin() as session:
                row = session.get(ApiToken, token_id)
                if row is None:
                    session.add(ApiToken(id=token_id, secret_hash=digest, role=Role.ADMIN, name=BOOTSTRAP_NAME))
                    return "created"
                if row.role != Role.ADMIN or not hmac.compare_digest(row.secret_hash, digest):
                    raise BootstrapRefused(f"SHARDCTL_BOOTSTRAP_ADMIN_TOKEN: token id {token_id} is already another"
                                           " token's (another secret or role); generate a new bootstrap token")
                return "revoked" if row.revoked_at is not None else "present"
        except IntegrityError:
            continue  # another replica inserted it between our read and our insert: read it again
    raise BootstrapRefused(f"SHARDCTL_BOOTSTRAP_ADMIN_TOKEN: token id {token_id} could not be written; try again")


def release_leases(sessions: Sessions, owner: str, *, submitting: bool) -> int:
    """Give back the jobs dispatcher `owner` leased and has not handed to a backend: QUEUED ones always,
    SUBMITTING ones only with `submitting` (when no submission of this process can still be in flight:
    then the next dispatcher finds or submits them by name). Returns how many were released."""
    from sqlalchemy import update

    from service.lifecycle import UNSUBMITTED
    from service.store.models import Job
    from service.store.vocab import JobStatus

    statuses = UNSUBMITTED if submitting else {JobStatus.QUEUED}
    with sessions.begin() as session:
        result = session.execute(update(Job).where(Job.lease_owner == owner, Job.status.in_(statuses))
                                 .values(lease_owner=None, lease_expires_at=None)
                                 .execution_options(synchronize_session=False))
    return int(getattr(result, "rowcount", 0) or 0)


def stop_dispatcher(sessions: Sessions, owner: str, stop: threading.Event, thread: threading.Thread,
                    grace_s: float) -> int:
    """Set `stop`, let the dispatcher's current cycle end (at most `grace_s`), then release the leases it
    still holds (`release_leases`; SUBMITTING ones only when the cycle ended). Returns how many."""
    stop.set()
    thread.join(grace_s)
    return release_leases(sessions, owner, submitting=not thread.is_alive())


#: The hosts that mean "every interface": not an address a job can call back.
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", "", "[::]", "*"})


def resolve_public_url(settings: Settings, host: str, port: int) -> tuple[str, str | None]:
    """Where jobs call back: SHARDCTL_PUBLIC_URL when set; else `http://host:port`, with this machine's
    hostname in place of a wildcard host. Returns the URL and, when it was chosen for the user, why."""
    if "public_url" in settings.model_fields_set:
        return settings.public_url.rstrip("/"), None
    if host in WILDCARD_HOSTS:
        name = socket.gethostname()
        return f"http://{name}:{port}", (f"--host {host or repr(host)} is not an address jobs can call, so they call"
                                         f" this machine's hostname {name}; set SHARDCTL_PUBLIC_URL to choose")
    return f"http://{f'[{host}]' if ':' in host else host}:{port}", None


def local_url(host: str, port: int) -> str:
    """The URL this machine's CLI uses to reach a server bound to `host`."""
    if host in WILDCARD_HOSTS:
        return f"http://127.0.0.1:{port}"
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


def app_factory() -> FastAPI:
    """The app of one `shardctl serve --workers N` worker process (uvicorn imports
    `service.cli.wiring:app_factory` with `factory=True` in each): settings from the environment (serve
    writes the public URL it resolved there), logging, a store of its own (not migrated: serve did,
    and loaded the pools, before it started the workers), the backends and the app."""
    from service.observability.logs import configure_logging

    settings = Settings()
    configure_logging(settings.log_format, settings.log_level)
    sessions = open_store(settings, migrate=False)
    return make_app(settings, sessions, make_backends(settings), public_url=settings.public_url, load=False)


def make_backends(settings: Settings) -> dict[str, Backend]:
    """The backends `settings` and this machine enable: `local` always, `slurm`, `kubernetes`."""
    from workers.backends import registry

    return registry.make_backends(settings)


def load_pools(settings: Settings, sessions: Sessions) -> None:
    """At start (serve, worker): SHARDCTL_POOLS_FILE's pools and quotas into the store (source file),
    and this machine's detected pools when no local pool is declared. A bad file stops the start with
    its path and the field at fault."""
    from service.scheduling.config_file import load_pools_file
    from service.store.pools import load_at_start

    declared = load_pools_file(settings.pools_file) if settings.pools_file is not None else None
    with sessions.begin() as session:
        load_at_start(session, declared, settings.local_gpus)


def make_dispatcher(settings: Settings, sessions: Sessions, backends: Mapping[str, Backend],
               public_url: str | None = None) -> Dispatcher:
    """The dispatcher over `backends`, configured from `settings`; jobs report to `public_url` (default:
    `settings.public_url`). Loads the pools first (`load_pools`)."""
    from service.scheduling.snapshot import SnapshotParams
    from workers.dispatch.context import DispatcherConfig
    from workers.dispatcher import Dispatcher

    load_pools(settings, sessions)
    config = DispatcherConfig(lease_s=settings.dispatcher_lease_s, batch=settings.dispatcher_batch,
                              max_attempts=settings.max_attempts, retry_backoff_s=settings.retry_backoff_s,
                              api_url=public_url or settings.public_url,
                              scheduling=SnapshotParams.from_settings(settings))
    return Dispatcher(sessions, backends, config)


def make_notifier(settings: Settings, sessions: Sessions) -> Notifier:
    """The webhook delivery worker (`workers.notify`), configured from `settings`; it runs beside the
    dispatcher, in the same process, on its own threads."""
    from workers.notify import Notifier, NotifierConfig

    config = NotifierConfig(timeout_s=settings.webhook_timeout_s, concurrency=settings.webhook_concurrency,
                            retry_base_s=settings.webhook_retry_base_s, retry_max_s=settings.webhook_retry_max_s,
                            horizon_s=settings.webhook_retry_horizon_s, allow_private=settings.webhook_allow_private)
    return Notifier(sessions, config)


def start_notifier(settings: Settings, sessions: Sessions, stop: threading.Event) -> threading.Thread:
    """`make_notifier` running in a daemon thread until `stop` is set."""
    notifier = make_notifier(settings, sessions)
    thread = threading.Thread(target=notifier.run_forever, args=(stop, settings.webhook_poll_s), daemon=True,
                              name="webhooks")
    thread.start()
    return thread


def make_app(settings: Settings, sessions: Sessions, backends: Mapping[str, Backend], public_url: str,
             *, load: bool = True) -> FastAPI:
    """The API on `sessions`' engine, told which backends the installation runs (`settings.backends`
    when set, else those built here) and how to preview what they would be sent (`POST /v1/plans`,
    `shardctl submit --dry-run`), and how to read jobs' logs and artifacts from them. `load`: load the
    pools first (`load_pools`; serve's worker processes leave it to serve)."""
    from service.api.app import create_app
    from workers.backends.outputs import BackendOutputs
    from workers.dispatch.request import launch_preview

    if load:
        load_pools(settings, sessions)
    configured = [str(kind) for kind in settings.backends] if settings.backends is not None else sorted(backends)
    return create_app(settings, engine=sessions.kw["bind"], launch_preview=launch_preview(backends, public_url),
                      configured_backends=configured, log_reader=BackendOutputs(backends))
