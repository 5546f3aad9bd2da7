"""The event feed: every job's events in id order, filtered, and scoped like jobs are.

The cursor is the last event id a reader has: `since=<id>` returns the events after it. A member
sees its team's events only, a job token its job's, an admin all of them; filtering on a team or a
job the caller cannot see finds nothing (as listing jobs does), never an error that would tell it
the other team's job exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.store.models import Event, Job, Team, as_utc, utcnow
from service.store.tokens import Principal
from service.store.visibility import visible_to

MAX_FEED_PAGE = 500
#: PostgreSQL: a gap in event ids before an event younger than this may be a transaction still in
#: flight (its id was taken, its row not yet committed); an older gap is a rolled-back insert.
IN_FLIGHT_S = 10.0
#: how many of the newest events `committed_horizon` looks at for gaps
HORIZON_WINDOW = 1000


@dataclass(frozen=True, slots=True)
class FeedFilter:
    """`type` is an exact kind (`job.succeeded`) or a prefix: ending in `.` or `*` (`job.`, `job.*`)."""

    team: str | None = None
    job_id: int | None = None
    type: str | None = None


@dataclass(frozen=True, slots=True)
class FeedEvent:
    """One event with what a feed reader needs to place it (its job's team and name)."""

    event: Event
    team: str
    job_name: str


def committed_horizon(session: Session, *, now: datetime | None = None) -> int | None:
    """The largest event id a reader may move its cursor to: no event with a smaller id can still
    appear. None: no limit.

    On PostgreSQL an event's id comes from a sequence when its row is inserted, but the row becomes
    visible when its transaction commits, which may be after a transaction that took a later id has
    committed; a reader that moved past that later id would never see the earlier one. So a reader
    stops before the first gap in ids that is followed by an event younger than `IN_FLIGHT_S` (the
    missing id may belong to a transaction still in flight; an older gap is a rolled-back insert).
    SQLite runs one writer at a time: ids become visible in order."""
    if session.get_bind().dialect.name != "postgresql":
        return None
    rows = list(reversed(session.execute(
        select(Event.id, Event.at).order_by(Event.id.desc()).limit(HORIZON_WINDOW)).all()))
    if not rows:
        return None
    now = as_utc(now or utcnow())
    young = [as_utc(at) > now - timedelta(seconds=IN_FLIGHT_S) for _, at in rows]
    horizon = rows[-1][0]
    if len(rows) == HORIZON_WINDOW and young[0]:  # the window is all young: a gap may lie before it
        horizon = rows[0][0] - 1
    for i in range(1, len(rows)):
        if rows[i][0] != rows[i - 1][0] + 1 and young[i]:
            return min(horizon, rows[i - 1][0])
    return horizon


def list_feed(session: Session, principal: Principal, filters: FeedFilter, *, since: int = 0,
              limit: int = 100) -> list[FeedEvent]:
    """The events after `since` that `principal` may see and `filters` match, oldest first, up to
    the `committed_horizon` (so a cursor never skips an event committed later)."""
    limit = max(1, min(limit, MAX_FEED_PAGE))
    stmt = (select(Event, Team.name, Job.name).join(Job, Job.id == Event.job_id).join(Team, Team.id == Job.team_id)
            .where(Event.id > since))
    horizon = committed_horizon(session)
    if horizon is not None:
        stmt = stmt.where(Event.id <= horizon)
    stmt = visible_to(stmt, principal)
    if filters.team is not None:
        stmt = stmt.where(Team.name == filters.team)
    if filters.job_id is not None:
        stmt = stmt.where(Event.job_id == filters.job_id)
    if filters.type:
        kind = filters.type
        if kind.endswith("*") or kind.endswith("."):
            stmt = stmt.where(Event.kind.startswith(kind.rstrip("*"), autoescape=True))
        else:
            stmt = stmt.where(Event.kind == kind)
    rows = session.execute(stmt.order_by(Event.id).limit(limit)).all()
    return [FeedEvent(event=event, team=team, job_name=job_name) for event, team, job_name in rows]
