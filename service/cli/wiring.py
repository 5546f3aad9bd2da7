"""Composition: the one place that builds the running system out of its parts.

The control plane (`service.*`) never imports `workers.*`: the API learns what the dispatcher can do
through what it is given (`launch_preview`, `configured_backends`). This module is the single
declared exception. It builds the store (engine, sessions, migrations), the first admin token, the
backends the settings enable, the dispatcher and the API app, so that `shardctl serve` and `shardctl
worker` only call it. `workers` is imported inside the functions that need it, so commands that build
nothing (`shardctl plan`, the API clients) never load it.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING

from sqlalchemy.orm import Session, sessionmaker

from service.settings import Settings

if TYPE_CHECKING:
    from fastapi import FastAPI

    from workers.backends.base import Backend
    from workers.dispatcher import Dispatcher
    from workers.notify import Notifier

Sessions = sessionmaker[Session]


def open_store(settings: Settings) -> Sessions:
    """A sessionmaker on the database `settings` names, migrated first (one engine per process; the
    engine is `sessions.kw["bind"]`). A SQLite file is created 0600 before the migrations open it."""
    from service.store import migrate
    from service.store.db import make_engine, make_sessionmaker, private_sqlite_file

    private_sqlite_file(settings.resolved_database_url)
    migrate.upgrade(settings.resolved_database_url)
    return make_sessionmaker(make_engine(settings.resolved_database_url))


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
    from workers.dispatcher import Dispatcher, DispatcherConfig

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


def make_app(settings: Settings, sessions: Sessions, backends: Mapping[str, Backend], public_url: str) -> FastAPI:
    """The API on `sessions`' engine, told which backends the installation runs (`settings.backends`
    when set, else those built here) and how to preview what they would be sent (`POST /v1/plans`,
    `shardctl submit --dry-run`), and how to read jobs' logs and artifacts from them."""
    from service.api.app import create_app
    from workers.backends.outputs import BackendOutputs
    from workers.dispatcher import launch_preview

    load_pools(settings, sessions)
    configured = [str(kind) for kind in settings.backends] if settings.backends is not None else sorted(backends)
    return create_app(settings, engine=sessions.kw["bind"], launch_preview=launch_preview(backends, public_url),
                      configured_backends=configured, log_reader=BackendOutputs(backends))
