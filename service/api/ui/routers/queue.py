"""The Queue page (`/ui/queue`): waiting jobs in admission order, each with its reasons, positions and
ETA band, from the dispatcher's queue view (`service.store.queue_view`, written after each cycle).

Contract:

- One page is one keyset query on the view's admission order (`ord > cursor`, 50 rows), filtered by
  pool (jobs that may use it), GPU kind and team, joined to the job for its name and status (a row of
  a job that left the queue since the view was computed is not shown).
- Visibility is explain's (`GET /v1/jobs/{id}/explain`): a member sees their own team's rows, named;
  other teams' waiting jobs are counted per GPU kind (jobs and GPUs), never named. Admins see all.
- The page says when the view was computed ("as of N s ago"), and that there is none when the
  dispatcher has not written one (or a pool or quota change dropped it). ETA bands are counted from
  now, as explain counts them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field, ValidationError, field_validator
from sqlalchemy import ColumnElement, func, literal, select
from sqlalchemy.orm import Session
from starlette.responses import Response

from service.api.deps import Db
from service.api.ui.render import page
from service.api.ui.session import Signed
from service.names import Label
from service.store.models import Job, as_utc, utcnow
from service.store.pools import effective_pools
from service.store.queue_models import QueueViewMeta, QueueViewRow
from service.store.queue_view import META_ID, ViewDoc, pools_of
from service.store.tokens import Principal
from service.store.visibility import sees_every_team
from service.store.vocab import JobStatus

router = APIRouter(tags=["ui"], include_in_schema=False)
PAGE_SIZE = 50


class QueueQuery(BaseModel):
    """The Queue page's query string; an empty field is ignored."""

    pool: Label | None = None
    gpu: str | None = Field(None, max_length=64)
    team: Label | None = None
    cursor: int | None = Field(None, ge=0, le=2**31 - 1)

    @field_validator("pool", "gpu", "team", "cursor", mode="before")
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        return None if value == "" else value

    def url(self, **changes: object) -> str:
        values = {**self.model_dump(), **changes}
        pairs = [(k, str(v)) for k, v in values.items() if v not in (None, "")]
        return "/ui/queue" + (f"?{urlencode(pairs)}" if pairs else "")


@dataclass(frozen=True, slots=True)
class QueueRow:
    """One waiting job as the page shows it."""

    job_id: int
    name: str
    team: str
    gpu: str
    gpus: int
    priority: int
    order: int  # 1-based place in the whole admission order
    pools: tuple[str, ...]
    doc: ViewDoc  # its band counted from now


@dataclass(frozen=True, slots=True)
class Others:
    """Other teams' waiting jobs of one GPU kind, counted (what a member may know of them)."""

    gpu: str
    jobs: int
    gpus: int


def parse_query(request: Request, principal: Principal) -> tuple[QueueQuery, list[str]]:
    raw = {k: request.query_params.get(k) for k in QueueQuery.model_fields if k in request.query_params}
    if not sees_every_team(principal):
        raw.pop("team", None)  # a member sees their own team's rows; the filter is theirs already
    try:
        return QueueQuery.model_validate(raw), []
    except ValidationError as exc:
        bad = {str(e["loc"][0]) for e in exc.errors() if e["loc"]}
        problems = [f"{e['loc'][0] if e['loc'] else 'query'}: {e['msg'].removeprefix('Value error, ')}"
                    for e in exc.errors()]
        return QueueQuery.model_validate({k: v for k, v in raw.items() if k not in bad}), problems


def _filters(query: QueueQuery) -> list[ColumnElement[bool]]:
    t = QueueViewRow
    out: list[ColumnElement[bool]] = []
    if query.pool:  # a DNS label: no LIKE wildcards in it
        out.append((literal(",") + t.pools + literal(",")).like(f"%,{query.pool},%"))
    if query.gpu:
        out.append(t.gpu == query.gpu)
    return out


def queue_rows(session: Session, principal: Principal, query: QueueQuery, age: float,
               limit: int) -> tuple[list[QueueRow], int | None]:
    """One page of waiting jobs the principal may see, in admission order, and the next page's cursor."""
    t = QueueViewRow
    stmt = (select(t, Job.name).join(Job, Job.id == t.job_id)
            .where(Job.status == JobStatus.QUEUED, Job.pool.is_(None), *_filters(query))  # still waiting
            .order_by(t.ord).limit(limit + 1))
    if not sees_every_team(principal):
        stmt = stmt.where(t.team == (principal.team_name or ""))
    elif query.team:
        stmt = stmt.where(t.team == query.team)
    if query.cursor is not None:
        stmt = stmt.where(t.ord > query.cursor)
    found = session.execute(stmt).all()
    rows = []
    for row, name in found[:limit]:
        doc = ViewDoc.decode(row.doc)
        rows.append(QueueRow(job_id=row.job_id, name=name, team=row.team, gpu=row.gpu, gpus=row.gpus,
                             priority=row.priority, order=row.ord + 1, pools=pools_of(row.pools),
                             doc=replace(doc, eta=doc.aged(age))))
    next_cursor = found[limit - 1][0].ord if len(found) > limit else None
    return rows, next_cursor


def other_teams(session: Session, principal: Principal, query: QueueQuery) -> list[Others]:
    """Per GPU kind, the waiting jobs of teams other than the member's (under the page's filters)."""
    t = QueueViewRow
    stmt = (select(t.gpu, func.count(), func.sum(t.gpus)).join(Job, Job.id == t.job_id)
            .where(Job.status == JobStatus.QUEUED, Job.pool.is_(None), t.team != (principal.team_name or ""),
                   *_filters(query))
            .group_by(t.gpu).order_by(t.gpu))
    return [Others(gpu, int(jobs), int(gpus or 0)) for gpu, jobs, gpus in session.execute(stmt)]


@router.get("/ui/queue")
def queue_page(request: Request, session: Signed, db: Db) -> Response:
    principal = session.principal
    query, problems = parse_query(request, principal)
    settings = request.app.state.settings
    with db.begin() as tx:
        meta = tx.get(QueueViewMeta, META_ID)
        now = utcnow()
        computed_at: datetime | None = as_utc(meta.computed_at) if meta is not None else None
        age = max(0.0, (now - computed_at).total_seconds()) if computed_at is not None else 0.0
        rows: list[QueueRow] = []
        next_cursor = None
        others: list[Others] = []
        if meta is not None:
            rows, next_cursor = queue_rows(tx, principal, query, age, PAGE_SIZE)
            if not sees_every_team(principal):
                others = other_teams(tx, principal, query)
        pools = effective_pools(tx, settings.local_gpus)
        kinds = sorted({p.pool.gpu for p in pools})
        return page(request, session, "queue.html", title="Queue", query=query, problems=problems, rows=rows,
                    next_cursor=next_cursor, others=others, meta=meta, age=age,
                    stale=meta is not None and age > settings.queue_view_max_age_s,
                    max_age=settings.queue_view_max_age_s, pools=[p.pool.name for p in pools], kinds=kinds)
