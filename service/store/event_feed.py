"""The event feed: every job's events in id order, filtered, and scoped like jobs are.

The cursor is the last event id a reader has: `since=<id>` returns the events after it. A member
sees its team's events only, a job token its job's, an admin all of them; filtering on a team or a
job the caller cannot see finds nothing (as listing jobs does), never an error that would tell it
the other team's job exists.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.store.models import Event, Job, Team
from service.store.tokens import Principal
from service.store.vocab import Role

MAX_FEED_PAGE = 500


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


def list_feed(session: Session, principal: Principal, filters: FeedFilter, *, since: int = 0,
              limit: int = 100) -> list[FeedEvent]:
    """The events after `since` that `principal` may see and `filters` match, oldest first."""
    limit = max(1, min(limit, MAX_FEED_PAGE))
    stmt = (select(Event, Team.name, Job.name).join(Job, Job.id == Event.job_id).join(Team, Team.id == Job.team_id)
            .where(Event.id > since))
    if principal.role == Role.MEMBER:
        stmt = stmt.where(Job.team_id == principal.team_id)
    elif principal.role == Role.JOB:
        stmt = stmt.where(Job.id == principal.job_id)
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
