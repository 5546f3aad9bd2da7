"""Team quotas in the store (`PUT /v1/teams/{team}/quota`, SHARDCTL_POOLS_FILE's `teams:`).

A team without a row has no quota declared: the engine treats it as owning nothing, so it runs
only on what it may borrow (see `service.scheduling.model`).
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.scheduling.model import TeamQuota
from service.store.db import upsert_into
from service.store.models import Team, TeamQuotaRow, utcnow
from service.store.queue_view import invalidate
from service.store.tokens import ensure_team


def get_quota(session: Session, team: Team) -> TeamQuota | None:
    row = session.get(TeamQuotaRow, team.id)
    return None if row is None else row.quota


def put_quota(session: Session, team: Team, quota: TeamQuota) -> bool:
    """Create or replace the team's quota; True when it is new. Idempotent under concurrent calls (an
    upsert: the last one to commit wins, none fails). The queue view is dropped (its answers may be
    wrong now) until the next dispatcher cycle."""
    invalidate(session)
    existed = session.scalar(select(TeamQuotaRow.team_id).where(TeamQuotaRow.team_id == team.id)) is not None
    insert = upsert_into(session, TeamQuotaRow).values(team_id=team.id, quota=quota, updated_at=utcnow())
    session.execute(insert.on_conflict_do_update(
        index_elements=["team_id"], set_={"quota": insert.excluded.quota, "updated_at": insert.excluded.updated_at}))
    session.expire_all()  # a row this session loaded before holds the old quota
    return not existed


def all_quotas(session: Session) -> dict[str, TeamQuota]:
    """Every declared quota by team name."""
    rows = session.execute(select(Team.name, TeamQuotaRow.quota).join(Team, Team.id == TeamQuotaRow.team_id))
    return {name: quota for name, quota in rows}


def put_quotas_by_name(session: Session, quotas: dict[str, TeamQuota]) -> None:
    """Write each team's quota (the pools file's `teams:`), creating the teams it names that do not exist."""
    for name, quota in sorted(quotas.items()):
        put_quota(session, ensure_team(session, name), quota)


__all__ = ["all_quotas", "get_quota", "put_quota", "put_quotas_by_name"]
