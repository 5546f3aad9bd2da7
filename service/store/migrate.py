"""Alembic, driven from code: `shardctl db upgrade`, the tests, and the serve command use these."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, pool

import migrations
from service.store.db import private_sqlite_file
from service.store.schema import metadata

MIGRATIONS_DIR = Path(migrations.__file__).resolve().parent


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def _prepare(url: str) -> None:
    """A SQLite file is created private (0600 in a 0700 folder) before Alembic opens it."""
    private_sqlite_file(url)


def upgrade(url: str, revision: str = "head") -> None:
    _prepare(url)
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    command.downgrade(alembic_config(url), revision)


def current_revision(url: str) -> str | None:
    engine = create_engine(url, poolclass=pool.NullPool)
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def drift(url: str) -> list[Any]:
    """Differences between the models and the migrated database; empty when they agree."""
    engine = create_engine(url, poolclass=pool.NullPool)
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True})
        return list(compare_metadata(ctx, metadata))
