"""Write and read the dispatcher's queue view (`service.store.queue_models`).

- `write_view` replaces the whole view with a fresh `service.scheduling.queue_view.queue_view` result
  in the caller's transaction.
- `invalidate` drops it (a change to pools or quotas: every answer in it may be wrong now); the next
  dispatcher cycle writes a new one.
- `read_explanation` answers `GET /v1/jobs/{id}/explain` for a waiting job from the view: one row for
  the job, and the rows ahead of it of its GPU kind (its own team's only, unless an admin asks). It
  answers None, and the caller computes the answer live, when there is no view, when the view is
  older than `max_age_s`, or when the job is not in it or changed since (submitted or requeued).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import delete, insert, select, text
from sqlalchemy.orm import Session

from service.scheduling.decisions import Eta, Explanation, Reason
from service.scheduling.queue_view import QueueEntry, from_view
from service.store.models import as_utc
from service.store.queue_models import QueueViewMeta, QueueViewRow

META_ID = 1
#: the advisory lock key a refresh holds on PostgreSQL ("shardqvw" as 8 bytes); `invalidate` waits for it
QUEUE_VIEW_LOCK_KEY = int.from_bytes(b"shardqvw", "big") & 0x7FFF_FFFF_FFFF_FFFF


class _Ahead(NamedTuple):
    job_id: int
    team: str
    gpu: str
    gpus: int
    priority: int
    order: int
    pools: Sequence[str]


def write_view(session: Session, entries: Sequence[QueueEntry], *, computed_at: datetime, seconds: float) -> None:
    """Replace the view with `entries` (one refresh), in the caller's transaction."""
    session.execute(delete(QueueViewRow))
    dumped: dict[int, dict[str, Any]] = {}  # the engine shares Reason objects between jobs: dump each once

    def reason(r: Reason) -> dict[str, Any]:
        got = dumped.get(id(r))
        if got is None:
            got = dumped[id(r)] = r.model_dump(mode="json")
        return got

    rows = [{"job_id": e.job_id, "ord": e.order, "team": e.team, "gpu": e.gpu, "gpus": e.gpus,
             "priority": e.priority, "pools": ",".join(e.pools),
             "doc": {"admitted": e.admitted, "reasons": [reason(r) for r in e.reasons],
                     "position": [e.team_position, e.pool_position], "others": [e.others_jobs, e.others_gpus],
                     "eta": [e.eta.earliest_s, e.eta.latest_s, e.eta.method]}} for e in entries]
    if rows:
        session.execute(insert(QueueViewRow), rows)
    meta = session.get(QueueViewMeta, META_ID)
    if meta is None:
        session.add(QueueViewMeta(id=META_ID, computed_at=computed_at, jobs=len(rows), seconds=seconds))
    else:
        meta.computed_at, meta.jobs, meta.seconds = computed_at, len(rows), seconds


def invalidate(session: Session) -> None:
    """No view until the next refresh: explain computes every answer live meanwhile. On PostgreSQL it
    first waits for a refresh in flight (the refresh's advisory lock), which would otherwise write a
    view computed before this change after it."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": QUEUE_VIEW_LOCK_KEY})
    session.execute(delete(QueueViewMeta))


def view_age_s(session: Session, now: datetime) -> float | None:
    """Seconds since the view was computed, or None when there is none."""
    meta = session.get(QueueViewMeta, META_ID)
    return None if meta is None else (as_utc(now) - as_utc(meta.computed_at)).total_seconds()


def read_explanation(session: Session, job_id: int, viewer_team: str | None, *, now: datetime,
                     max_age_s: float, changed_at: datetime | None = None) -> Explanation | None:
    """The job's explanation from the view (see the module's docstring), its ETA band counted from `now`.
    None as well when the job's state changed after the view was computed (`changed_at`: a job admitted
    and back in the queue since, after a preemption or a retry, has an older row that no longer holds)."""
    meta = session.get(QueueViewMeta, META_ID)
    if meta is None:
        return None
    age = (as_utc(now) - as_utc(meta.computed_at)).total_seconds()
    if age > max_age_s or age < -5:  # a clock far behind the dispatcher's: do not trust the view
        return None
    if changed_at is not None and as_utc(changed_at) > as_utc(meta.computed_at):
        return None
    row = session.get(QueueViewRow, job_id)
    if row is None:
        return None
    doc = row.doc
    earliest, latest, method = doc["eta"]
    if earliest is not None:
        earliest = round(max(0.0, earliest - age), 1)
    if latest is not None:
        latest = round(max(0.0, latest - age), 1)
    pools = tuple(row.pools.split(",")) if row.pools else ()
    entry = QueueEntry(job_id=row.job_id, team=row.team, gpu=row.gpu, gpus=row.gpus, priority=row.priority,
                       order=row.ord, pools=pools, admitted=doc["admitted"],
                       reasons=tuple(Reason.model_validate(r) for r in doc["reasons"]),
                       team_position=doc["position"][0], pool_position=doc["position"][1],
                       others_jobs=doc["others"][0], others_gpus=doc["others"][1],
                       eta=Eta(earliest_s=earliest, latest_s=latest,
                               method=f"{method}; from the dispatcher's queue view of {max(0.0, age):.0f} s ago"))
    t = QueueViewRow
    stmt = (select(t.job_id, t.team, t.gpu, t.gpus, t.priority, t.ord, t.pools)
            .where(t.gpu == row.gpu, t.ord < row.ord).order_by(t.ord))
    if viewer_team is not None:
        stmt = stmt.where(t.team == viewer_team)
    ahead = [_Ahead(job, team, gpu, gpus, priority, order, names.split(",") if names else [])
             for job, team, gpu, gpus, priority, order, names in session.execute(stmt)]
    answer = from_view(entry, ahead, viewer_team)
    return answer.model_copy(update={"as_of": as_utc(meta.computed_at).timestamp()})


__all__ = ["QUEUE_VIEW_LOCK_KEY", "invalidate", "read_explanation", "view_age_s", "write_view"]
