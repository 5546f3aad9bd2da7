"""A throwaway PostgreSQL database for a benchmark run, created and migrated on entry, dropped on exit.

Benchmarks run as scripts (`.venv/bin/python benchmarks/NAME.py`), so they import this module by its
bare name: `from scratch_db import scratch_database`.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from service.store import migrate


@contextmanager
def scratch_database(base_url: str, purpose: str) -> Iterator[str]:
    """Yield the URL of a new database `shardctl_bench_<purpose>_<random>` on the server of `base_url`,
    migrated to the head revision. It is dropped (forcibly, closing stray connections) on exit, errors
    included; `base_url`'s user needs CREATEDB."""
    admin = create_engine(base_url, isolation_level="AUTOCOMMIT")
    name = f"shardctl_bench_{purpose}_{secrets.token_hex(4)}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        url = make_url(base_url).set(database=name).render_as_string(hide_password=False)
        migrate.upgrade(url)
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
