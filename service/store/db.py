"""Engines and sessions for SQLite (the embedded default) and PostgreSQL."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker


def make_engine(url: str) -> Engine:
    """An engine with the settings each database needs for concurrent API and dispatcher use.

    SQLite: WAL journal, foreign keys on, a busy timeout so that concurrent writers wait instead of
    failing, and `BEGIN IMMEDIATE` for every transaction, reads included: each one takes the write
    lock, so on SQLite transactions run one at a time (PostgreSQL is the database for concurrency).
    """
    if url.startswith("sqlite"):
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
    return create_engine(url, pool_size=40, max_overflow=10, pool_recycle=1800, pool_timeout=30)


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)
