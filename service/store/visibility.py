"""Who may see which job, the one rule of the API, the dashboard and the event feed: an admin every job,
a member their team's jobs, a job token its own job. Another's job is "not found", never "forbidden".
(The heartbeat insert, `jobs.add_heartbeat`, states the same rule in its prebuilt statement.)"""

from __future__ import annotations

from typing import Protocol, TypeVarTuple

from sqlalchemy import Select, false

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


def visible_to(stmt: Select[*Row], principal: Principal) -> Select[*Row]:
    """`stmt` (over `Job`) narrowed to the jobs `principal` may see: `can_see` as SQL (an admin every job,
    a member their team's, a job token its own job)."""
    if principal.role == Role.ADMIN:
        return stmt
    if principal.role == Role.MEMBER:
        return stmt.where(Job.team_id == principal.team_id)
    if principal.role == Role.JOB:
        return stmt.where(Job.id == principal.job_id)
    return stmt.where(false())  # a role this rule does not know sees nothing
