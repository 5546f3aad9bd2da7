"""Migration 0012 moves a retry's back-off out of `lease_expires_at` into `jobs.not_before`, and back."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from service.store import migrate

_ROWS = "SELECT id, lease_owner, lease_expires_at{} FROM jobs ORDER BY id"


def _rows(engine: sa.Engine, *, not_before: bool) -> dict[int, tuple[Any, ...]]:
    with engine.begin() as conn:
        return {r[0]: tuple(r[1:]) for r in conn.execute(sa.text(_ROWS.format(", not_before" if not_before else "")))}


def test_a_back_off_under_way_moves_to_not_before_and_a_lease_stays_a_lease(db_url: str) -> None:
    migrate.downgrade(db_url, "0011")
    engine = sa.create_engine(db_url)
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO teams (name, created_at) VALUES ('alpha', CURRENT_TIMESTAMP)"))
        team_id = conn.execute(sa.text("SELECT id FROM teams")).scalar_one()
        jobs = sa.table("jobs", *(sa.column(c) for c in ("id", "name", "team_id", "status", "backend", "priority",
                                                          "created_by", "created_at", "updated_at", "layout",
                                                          "lease_owner", "lease_expires_at")),
                        sa.column("spec", sa.JSON()), sa.column("plan", sa.JSON()))
        at = datetime(2026, 12, 7, 10, 0, tzinfo=UTC)
        for job_id, owner, expiry in ((1, None, at),  # QUEUED after a failure: backing off until then
                                      (2, "dispatcher-a", at),  # leased: a lease
                                      (3, None, None)):  # free to lease
            conn.execute(jobs.insert().values(
                id=job_id, name="old", team_id=team_id, status="QUEUED", backend="local", priority=0,
                created_by="t", created_at=sa.func.now(), updated_at=sa.func.now(), layout="", spec={}, plan={},
                lease_owner=owner, lease_expires_at=expiry))
    before = _rows(engine, not_before=False)

    migrate.upgrade(db_url)
    after = _rows(engine, not_before=True)
    assert after[1] == (None, None, before[1][1])  # the back-off is not_before now, and no lease
    assert after[2] == (*before[2], None)  # a lease keeps its expiry and has no back-off
    assert after[3] == (None, None, None)

    migrate.downgrade(db_url, "0011")
    assert _rows(engine, not_before=False) == before  # the back-off is a lease expiry with no owner again
    migrate.upgrade(db_url)
    engine.dispose()
