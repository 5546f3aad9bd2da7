"""Write and read the dispatcher's queue view (`service.store.queue_models`).

- `write_view` replaces the whole view with a fresh `service.scheduling.queue_view.queue_view` result
  in the caller's transaction.
- `invalidate` drops it (a change to pools or quotas: every answer in it may be wrong now); the next
  dispatcher cycle writes a new one.
- `read_explanation` answers `GET /v1/jobs/{id}/explain` for a waiting job from the view: one row for
  the job, and the rows ahead of it of its GPU kind (its own team's only, unless an admin asks). It
  answers None, and the caller computes the answer live, when there is no view, when the view is
  older than `max_age_s`, or when the job is not in it or changed since (submitted or requeued).
- `ViewDoc` is the one codec of a row's `doc` (its explanation less what the row's columns hold);
  `pools_of` reads the row's `pools` column. Both the API and the dashboard's Queue page read rows
  through them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
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


@dataclass(frozen=True, slots=True)
class ViewDoc:
    """A row's `doc`: the job's explanation as its own team sees it, less the row's own columns.

    Stored as `{"admitted": bool, "reasons": [Reason as JSON], "position": [team, pool],
    "others": [jobs, gpus], "eta": [earliest_s, latest_s, method]}`; `encode` writes exactly that and
    `decode` reads it (every field checked), so a view written before a change of this class reads
    the same."""

    admitted: bool
    reasons: tuple[Reason, ...]
    team_position: int
    pool_position: int
    others_jobs: int  # competing jobs ahead of it from other teams, and their GPUs
    others_gpus: int
    eta: Eta  # counted from when the view was computed

    @staticmethod
    def encode(e: ViewDoc | QueueEntry, dumped: dict[int, dict[str, Any]]) -> dict[str, Any]:
        """The stored JSON of `e` (a `QueueEntry` has every field); `dumped` keeps each `Reason`
        dumped so far by `id` (the engine shares `Reason` objects between jobs: dump each once)."""
        reasons = []
        for r in e.reasons:
            got = dumped.get(id(r))
            if got is None:
                got = dumped[id(r)] = r.model_dump(mode="json")
            reasons.append(got)
        return {"admitted": e.admitted, "reasons": reasons, "position": [e.team_position, e.pool_position],
                "others": [e.others_jobs, e.others_gpus], "eta": [e.eta.earliest_s, e.eta.latest_s, e.eta.method]}

    @classmethod
    def decode(cls, doc: dict[str, Any]) -> ViewDoc:
        """The document `encode` wrote."""
        team_position, pool_position = doc["position"]
        others_jobs, others_gpus = doc["others"]
        earliest, latest, method = doc["eta"]
        return cls(admitted=bool(doc["admitted"]), reasons=tuple(Reason.model_validate(r) for r in doc["reasons"]),
                   team_position=int(team_position), pool_position=int(pool_position),
                   others_jobs=int(others_jobs), others_gpus=int(others_gpus),
                   eta=Eta(earliest_s=earliest, latest_s=latest, method=method))

    def aged(self, age_s: float) -> Eta:
        """The band counted from `age_s` seconds after the view was computed (never below 0)."""
        earliest, latest = self.eta.earliest_s, self.eta.latest_s
        return self.eta.model_copy(update={
            "earliest_s": None if earliest is None else round(max(0.0, earliest - age_s), 1),
            "latest_s": None if latest is None else round(max(0.0, latest - age_s), 1)})


def pools_of(column: str) -> tuple[str, ...]:
    """A row's `pools` column read back: the pools the job may use."""
    return tuple(column.split(",")) if column else ()


def write_view(session: Session, entries: Sequence[QueueEntry], *, computed_at: datetime, seconds: float) -> None:
    """Replace the view with `entries` (one refresh), in the caller's transaction."""
    session.execute(delete(QueueViewRow))
    dumped: dict[int, dict[str, Any]] = {}
    rows = [{"job_id": e.job_id, "ord": e.order, "team": e.team, "gpu": e.gpu, "gpus": e.gpus,
             "priority": e.priority, "pools": ",".join(e.pools), "doc": ViewDoc.encode(e, dumped)}
            for e in entries]
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
    doc = ViewDoc.decode(row.doc)
    eta = doc.aged(age)
    entry = QueueEntry(job_id=row.job_id, team=row.team, gpu=row.gpu, gpus=row.gpus, priority=row.priority,
                       order=row.ord, pools=pools_of(row.pools), admitted=doc.admitted, reasons=doc.reasons,
                       team_position=doc.team_position, pool_position=doc.pool_position,
                       others_jobs=doc.others_jobs, others_gpus=doc.others_gpus,
                       eta=eta.model_copy(update={
                           "method": f"{eta.method}; from the dispatcher's queue view of {max(0.0, age):.0f} s ago"}))
    t = QueueViewRow
    stmt = (select(t.job_id, t.team, t.gpu, t.gpus, t.priority, t.ord, t.pools)
            .where(t.gpu == row.gpu, t.ord < row.ord).order_by(t.ord))
    if viewer_team is not None:
        stmt = stmt.where(t.team == viewer_team)
    ahead = [_Ahead(job, team, gpu, gpus, priority, order, pools_of(names))
             for job, team, gpu, gpus, priority, order, names in session.execute(stmt)]
    answer = from_view(entry, ahead, viewer_team)
    return answer.model_copy(update={"as_of": as_utc(meta.computed_at).timestamp()})


__all__ = ["QUEUE_VIEW_LOCK_KEY", "ViewDoc", "invalidate", "pools_of", "read_explanation", "view_age_s", "write_view"]
