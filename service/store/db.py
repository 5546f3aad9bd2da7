"""Engines and sessions for SQLite (the embedded default) and PostgreSQL."""

from __future__ import annotations

import os
import select
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec
from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.dialects.postgresql import Insert as PostgresInsert
from sqlalchemy.dialects.postgresql import insert as postgres_insert
from sqlalchemy.dialects.sqlite import Insert as SqliteInsert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.orm import Session, sessionmaker

#: SQLite's own companions of a database file; it creates them with the database file's mode.
SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")


def upsert_into(session: Session, table: Any) -> PostgresInsert | SqliteInsert:
    """An INSERT into `table` in the session's dialect, which takes `on_conflict_do_nothing` and
    `on_conflict_do_update` (both databases spell them alike). Racing inserts of one key then never
    fail: on PostgreSQL the second waits for the first to commit, then does nothing (or updates)."""
    if session.get_bind().dialect.name == "postgresql":
        return postgres_insert(table)
    return sqlite_insert(table)


def sqlite_path(url: str) -> Path | None:
    """The file a SQLite URL names; None for another database or an in-memory one."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:" \
            or parsed.database.startswith("file:"):
        return None
    return Path(parsed.database)


def private_sqlite_file(url: str) -> Path | None:
    """Make the SQLite database file that `url` names readable by its owner only, before anything opens it.

    A new file is created empty with mode 0600 (`os.open(..., 0o600)`; SQLite gives its `-wal` and `-shm`
    files the database file's mode) in a folder created 0700. A file this user owns that is already
    there with group or other bits (an installation from before this rule) loses them. Other
    databases: nothing to do. Returns the file, or None."""
    path = sqlite_path(url)
    if path is None:
        return None
    if not path.parent.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        for candidate in (path, *(path.with_name(path.name + side) for side in SQLITE_SIDE_FILES)):
            try:
                info = candidate.stat()
            except FileNotFoundError:
                continue
            if info.st_uid == os.getuid() and info.st_mode & 0o077:
                candidate.chmod(stat.S_IMODE(info.st_mode) & 0o700)
    return path


def make_engine(url: str) -> Engine:
    """An engine with the settings each database needs for concurrent API and dispatcher use.

    SQLite: WAL journal, foreign keys on, a busy timeout so that concurrent writers wait instead of
    failing, and `BEGIN IMMEDIATE` for every transaction, reads included: each one takes the write
    lock, so on SQLite transactions run one at a time (PostgreSQL is the database for concurrency).
    The SQLite file is created 0600 before the engine opens it (`private_sqlite_file`).
    """
    if url.startswith("sqlite"):
        private_sqlite_file(url)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(conn: Any, _record: Any) -> None:
            cur = conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        @event.listens_for(engine, "begin")
        def _sqlite_begin_immediate(conn: Any) -> None:
            # Take the write lock at BEGIN: a read-then-write transaction cannot then fail halfway
            # with "database is locked" (SQLite cannot upgrade a read lock under contention).
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        @event.listens_for(engine, "connect")
        def _no_pysqlite_autobegin(conn: Any, _record: Any) -> None:
            conn.isolation_level = None

        return engine
    # The pool holds as many connections as the API has handler threads (40), so that a busy server
    # reuses connections instead of opening one per request; recycling replaces a ping per checkout.
    # JSONB documents (a job's spec and plan, event data) go through msgspec: it reads them about 4x
    # faster than the json module (a tenth of GET /v1/jobs/{id}'s CPU was json.loads) and gives the
    # same Python values.
    engine = create_engine(url, pool_size=40, max_overflow=10, pool_recycle=1800, pool_timeout=30,
                           json_serializer=msgspec.json.encode, json_deserializer=msgspec.json.decode)

    @event.listens_for(engine, "checkout")
    def _not_closed_by_server(conn: Any, _record: Any, _proxy: Any) -> None:
        if closed_by_server(conn):
            raise DisconnectionError("the server closed this pooled connection")  # the pool takes another

    @event.listens_for(engine, "connect")
    def _utc_session(conn: Any, _record: Any) -> None:
        # psycopg gives every timestamptz the session's time zone. The server's default is often a
        # name such as Etc/UTC, read as a ZoneInfo that psycopg and then `as_utc` convert from (50
        # rows of three times: 180 us to fetch, against 125 in UTC); in UTC each comes with
        # `datetime.UTC` itself, which `as_utc` passes through.
        # A SET, not a startup option, since poolers such as PgBouncer refuse unknown startup options
        # (and restore TimeZone per client). Committed at once: a transaction rolled back undoes it.
        autocommit, conn.autocommit = conn.autocommit, True
        conn.execute("SET TIME ZONE 'UTC'")
        conn.autocommit = autocommit

    return engine


def closed_by_server(conn: Any) -> bool:
    """Whether the server has ended an idle pooled psycopg connection (a restart, `pg_terminate_backend`,
    an idle timeout), told without a round trip: an idle connection's socket has nothing to read
    unless the server sent its farewell or closed it. The pool then replaces it before a statement
    fails on it, so a request never sees the dead connection."""
    if conn.closed:
        return True
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def one_statement(engine: Engine) -> Iterator[Connection]:
    """A connection for work that is one SQL statement, atomic by itself. On PostgreSQL it runs in
    autocommit: one round trip, where a transaction adds a BEGIN and a COMMIT (psycopg sends each as
    its own). On SQLite it is a transaction as any other (`BEGIN IMMEDIATE`, see `make_engine`).
    Whatever must not happen unless the statement succeeds comes after it; nothing rolls back."""
    if engine.dialect.name == "postgresql":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            yield conn
    else:
        with engine.begin() as conn:
            yield conn
