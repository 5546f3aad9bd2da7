"""Who may see what, the one rule of the API, the dashboard, the CLI and the event feed:

- **jobs**: an admin every job, a member their team's jobs, a job token its own job (`can_see`,
  `visible_to`, `visible_where`). Another's job is "not found", never "forbidden". (The heartbeat
  insert, `jobs.add_heartbeat`, states the same rule in its prebuilt statement.)
- **teams** and what is kept per team (quotas, usage, webhooks, the queue's rows): an admin every
  team, a member their own, a job token none (`sees_every_team`, `may_see_team`, `team_scope`).
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVarTuple, cast

from sqlalchemy import ColumnElement, Select, bindparam, false

from service.store.models import Job
from service.store.tokens import Principal
from service.store.vocab import Role

Row = TypeVarTuple("Row")


class JobKeys(Protocol):
    id: int
    team_id: int


def can_see(principal: Principal, job: JobKeys) -> bool:
    """The rule for one loaded job (an ORM `Job`, or a Core row with its `id` and `team_id`)."""
    if principal.role == Role.ADMIN:
        return True
    if principal.role == Role.MEMBER:
        return job.team_id == principal.team_id
    return principal.job_id == job.id


def sees_every_team(principal: Principal) -> bool:
    """An admin: every team, and every team's jobs, quotas, webhooks and queue rows, by name."""
    return principal.role == Role.ADMIN


def may_see_team(principal: Principal, team_id: int | None) -> bool:
    """Whether `principal` sees team `team_id` and what is kept for it (None: every team's, an admin's)."""
    if sees_every_team(principal):
        return True
    return principal.role == Role.MEMBER and team_id is not None and team_id == principal.team_id


def team_scope(principal: Principal, column: Any) -> ColumnElement[bool] | None:
    """`may_see_team` as SQL over a column holding a team id (None: no condition, an admin's)."""
    if sees_every_team(principal):
        return None
    if principal.role == Role.MEMBER and principal.team_id is not None:
        return cast(ColumnElement[bool], column == principal.team_id)
    return false()


def visible_to(stmt: Select[*Row], principal: Principal) -> Select[*Row]:
    """`stmt` (over `Job`) narrowed to the jobs `principal` may see: `can_see` as SQL (an admin every job,
    a member their team's, a job token its own job)."""
    condition = _rule(principal.role, principal.team_id, principal.job_id)
    return stmt if condition is None else stmt.where(condition)


#: The bind parameters `visible_where`'s conditions read.
VISIBLE_TEAM, VISIBLE_JOB = "visible_team", "visible_job"


def visible_where(role: Role) -> ColumnElement[bool] | None:
    """`visible_to`'s condition for any principal of `role` (None: an admin's, who sees every job), for a
    statement built once: it reads the principal's team or job id from the bind parameters that
    `visibility_values` gives, which every execution must pass."""
    return _rule(role, bindparam(VISIBLE_TEAM), bindparam(VISIBLE_JOB))


def visibility_values(principal: Principal) -> dict[str, int | None]:
    """The values of `visible_where(principal.role)`'s bind parameters (both names, whichever it reads)."""
    return {VISIBLE_TEAM: principal.team_id, VISIBLE_JOB: principal.job_id}


def _rule(role: Role, team: object, job: object) -> ColumnElement[bool] | None:
    if role == Role.ADMIN:  # `sees_every_team`
        return None
    if role == Role.MEMBER:
        return Job.team_id == team
    if role == Role.JOB:
        return Job.id == job
    return false()  # a role this rule does not know sees nothing
