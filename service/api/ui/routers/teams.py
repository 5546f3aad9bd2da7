"""The Teams page (`/ui/teams`): each team's quota against its use, per GPU kind, and its GPU hours
over the last days as a chart.

Thin over the service layer: a team's quota and usage come from the operations behind
`GET /v1/teams/{team}/quota` and `/usage` (`service.api.ops.teams`), so the page and the API agree
and apply the same visibility (a member sees their own team; an admin every team). The team list is
one keyset query on the name (10 a page), filtered by a part of the name.

"Lent" is what the team's unused nominal quota of a kind lends to others now: the least of its
unused nominal (within its lending limit) and what other teams borrow of that kind. Where several
teams have unused quota, each is shown the whole of what others borrow up to its own unused
quota: an upper bound, as the engine does not say whose quota a borrower uses.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, time, timedelta
from typing import Annotated
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Request
from sqlalchemy import select
from sqlalchemy.orm import Session
from starlette.responses import Response

from service.api.deps import Db
from service.api.ops.teams import QuotaOut, UsageOut, team_quota, team_usage
from service.api.ui.render import page
from service.api.ui.session import Signed
from service.scheduling.model import TeamQuota
from service.scheduling.snapshot import running_jobs
from service.store.models import Team, utcnow
from service.store.pools import effective_pools
from service.store.quotas import all_quotas
from service.store.tokens import Principal
from service.store.usage import gpu_seconds
from service.store.visibility import team_scope

router = APIRouter(tags=["ui"], include_in_schema=False)
PAGE_SIZE = 10
DAYS = 7


@dataclass(frozen=True, slots=True)
class KindRow:
    """One GPU kind of a team: quota, use now, and waiting demand."""

    gpu: str
    nominal: int | None
    borrowing_limit: int | None
    lending_limit: int | None
    admitted: int
    borrowed: int
    lent: int
    waiting_jobs: int
    waiting_gpus: int
    gpu_hours: float


@dataclass(frozen=True, slots=True)
class Day:
    day: str
    gpu_hours: float


@dataclass
class TeamCard:
    name: str
    quota: QuotaOut
    usage: UsageOut
    kinds: list[KindRow] = field(default_factory=list)
    days: list[Day] = field(default_factory=list)

    @property
    def max_day(self) -> float:
        return max((d.gpu_hours for d in self.days), default=0.0)


def borrowed_by_kind(session: Session, local_gpus: str | None, now: datetime) -> dict[str, dict[str, int]]:
    """GPU kind -> team -> GPUs it holds above its nominal quota now."""
    pools = effective_pools(session, local_gpus)
    quotas = all_quotas(session)
    held: dict[tuple[str, str], int] = defaultdict(int)
    for r in running_jobs(session, pools, now):
        held[(r.gpu, r.team)] += r.gpus
    out: dict[str, dict[str, int]] = defaultdict(dict)
    for (gpu, team), gpus in held.items():
        quota = quotas.get(team) or TeamQuota()
        nominal = quota.flavors[gpu].nominal if gpu in quota.flavors else 0
        if gpus > nominal:
            out[gpu][team] = gpus - nominal
    return out


def daily_gpu_hours(session: Session, team_id: int, today: datetime, days: int = DAYS) -> list[Day]:
    """GPU hours (all kinds) per UTC day, the last `days` days up to now, oldest first."""
    start = datetime.combine(today.date(), time(), UTC)
    out = []
    for back in range(days - 1, -1, -1):
        since = start - timedelta(days=back)
        until = min(since + timedelta(days=1), today)
        used = gpu_seconds(session, since=since, now=until, team_id=team_id)
        out.append(Day(since.date().isoformat(), round(sum(sum(k.values()) for k in used.values()) / 3600, 2)))
    return out


def team_card(db: Db, principal: Principal, team: Team, borrowed: dict[str, dict[str, int]], now: datetime,
              local_gpus: str | None) -> TeamCard:
    quota = team_quota(db, principal, team.name)
    usage = team_usage(db, principal, team.name, now - timedelta(days=DAYS), local_gpus=local_gpus)
    kinds = sorted(set(quota.quota.flavors) | set(usage.admitted) | set(usage.waiting) | set(usage.gpu_seconds))
    card = TeamCard(team.name, quota, usage)
    for kind in kinds:
        flavor = quota.quota.flavors.get(kind)
        nominal = flavor.nominal if flavor else 0
        unused = max(0, nominal - usage.admitted.get(kind, 0))
        if flavor is not None and flavor.lending_limit is not None:
            unused = min(unused, flavor.lending_limit)
        others = sum(n for t, n in borrowed.get(kind, {}).items() if t != team.name)
        waiting = usage.waiting.get(kind, {})
        card.kinds.append(KindRow(
            gpu=kind, nominal=flavor.nominal if flavor else None,
            borrowing_limit=flavor.borrowing_limit if flavor else None,
            lending_limit=flavor.lending_limit if flavor else None, admitted=usage.admitted.get(kind, 0),
            borrowed=usage.borrowed.get(kind, 0), lent=min(unused, others), waiting_jobs=waiting.get("jobs", 0),
            waiting_gpus=waiting.get("gpus", 0), gpu_hours=round(usage.gpu_seconds.get(kind, 0.0) / 3600, 2)))
    with db.begin() as tx:
        card.days = daily_gpu_hours(tx, team.id, now)
    return card


@router.get("/ui/teams")
def teams_page(request: Request, session: Signed, db: Db,
               name: Annotated[str, Query(max_length=63)] = "",
               cursor: Annotated[str, Query(max_length=63)] = "") -> Response:
    principal = session.principal
    local_gpus = request.app.state.settings.local_gpus
    now = utcnow()
    with db.begin() as tx:
        stmt = select(Team).order_by(Team.name).limit(PAGE_SIZE + 1)
        scope = team_scope(principal, Team.id)
        if scope is not None:
            stmt = stmt.where(scope)
        if name:
            stmt = stmt.where(Team.name.contains(name, autoescape=True))
        if cursor:
            stmt = stmt.where(Team.name > cursor)
        teams = list(tx.scalars(stmt))
        borrowed = borrowed_by_kind(tx, local_gpus, now)
    next_cursor = teams[PAGE_SIZE - 1].name if len(teams) > PAGE_SIZE else None
    cards = [team_card(db, principal, t, borrowed, now, local_gpus) for t in teams[:PAGE_SIZE]]

    def url(**changes: str | None) -> str:
        values = {"name": name, "cursor": cursor, **changes}
        pairs = [(k, v) for k, v in values.items() if v]
        return "/ui/teams" + (f"?{urlencode(pairs)}" if pairs else "")

    return page(request, session, "teams.html", title="Teams", cards=cards, name=name, cursor=cursor,
                next_cursor=next_cursor, url=url, days=DAYS)
