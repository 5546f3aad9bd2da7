"""Job queries and commands for the API: create (idempotently), list, read, cancel, report.

Visibility is enforced here, not in the routers: a member sees only their team's jobs, and a job
that is not visible does not exist (`NotFound`), so nobody learns of another team's jobs.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, Protocol, TypeVarTuple

from sqlalchemy import (
    ColumnElement,
    Connection,
    Insert,
    Select,
    bindparam,
    func,
    insert,
    literal_column,
    select,
)
from sqlalchemy.dialects.postgresql import JSONB, aggregate_order_by
from sqlalchemy.orm import Session, selectinload, undefer
from sqlalchemy.sql.elements import KeyedColumnElement

from service.backend_options import BackendKind
from service.lifecycle import SUBMITTED, TERMINAL
from service.planner.result import Plan
from service.spec import TrainingSpec
from service.store.event_feed import committed_horizon
from service.store.job_sort import (
    DEFAULT_SORT,
    After,
    JobCursor,
    JobSort,
    Segment,
    SortField,
    cursor_after,
    cursor_values,
    segments,
)
from service.store.known_tokens import TOKEN_LIVE, LiveValues, Unproven
from service.store.models import Attempt, Event, IdempotencyKey, Job, Measurement, Team, as_utc
from service.store.queue_view import invalidate as invalidate_queue_view
from service.store.states import add_event, transition
from service.store.tokens import Conflict, NotFound, Principal
from service.store.visibility import can_see, visibility_values, visible_where
from service.store.vocab import AttemptStatus, EventKind, FailureClass, JobStatus, MeasurementKind, Role

MAX_PAGE = 200
Row = TypeVarTuple("Row")


def body_hash(body: Any) -> str:
    """Hash of a JSON body that ignores key order and whitespace."""
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def idempotency_scope(principal: Principal) -> str:
    return f"team:{principal.team_id}" if principal.team_id is not None else f"token:{principal.token_id}"


def find_idempotent(session: Session, scope: str, key: str, digest: str) -> Job | None:
    """The job an earlier request with this key created; `Conflict` if that request's body differed."""
    row = session.scalar(select(IdempotencyKey).where(IdempotencyKey.scope == scope, IdempotencyKey.key == key))
    if row is None:
        return None
    if row.body_hash != digest:
        raise Conflict(f"Idempotency-Key {key!r} was already used with a different body")
    job = session.get(Job, row.job_id)
    assert job is not None
    return job


class TeamRef(Protocol):
    """A team as much as inserting its jobs needs: a `Team` row, or what a submission read of it."""

    @property
    def id(self) -> int: ...

    @property
    def name(self) -> str: ...


@dataclass(frozen=True, slots=True)
class NewJob:
    """A planned job to queue: the spec as submitted (its team resolved) and the plan that fits it."""

    team: TeamRef
    spec: TrainingSpec
    plan: Plan


def visible_job(session: Session, principal: Principal, job_id: int, *, for_update: bool = False,
                detail: bool = False) -> Job:
    """The job if the principal may see it, else `NotFound` (never 'forbidden': that would leak it).
    `detail` loads the spec, the plan and the attempts in the same round trips."""
    stmt = select(Job).where(Job.id == job_id)
    if detail:
        stmt = stmt.options(undefer(Job.spec), undefer(Job.plan), selectinload(Job.attempts))
    if for_update:
        stmt = stmt.with_for_update()
    job = session.scalar(stmt)
    if job is None or not can_see(principal, job):
        raise NotFound(f"no job {job_id}")
    return job


def _detail_statements() -> tuple[Select[Any], Select[Any], Select[Any]]:
    jobs, teams, attempts, measured = Job.__table__, Team.__table__, Attempt.__table__, Measurement.__table__
    job = (select(*jobs.c, teams.c.name.label("team_name")).join(teams, teams.c.id == jobs.c.team_id)
           .where(jobs.c.id == bindparam("job_id")))
    tries = select(*attempts.c).where(attempts.c.job_id == bindparam("job_id")).order_by(attempts.c.number)
    newest = (select(func.max(measured.c.id)).where(measured.c.job_id == bindparam("job_id"))
              .group_by(measured.c.kind))
    return job, tries, select(measured.c.kind, measured.c.at, measured.c.data).where(measured.c.id.in_(newest))


#: Built once: what `job_detail` runs on SQLite (`_DETAIL_IN_ONE`, on PostgreSQL, extends `_DETAIL_JOB`).
_DETAIL_JOB, _DETAIL_ATTEMPTS, _NEWEST_MEASURED = _detail_statements()


@dataclass(frozen=True, slots=True)
class AttemptShown:
    """An attempt as a job's detail shows it: the columns of `attempts` that `detail_out` reads."""

    number: int
    backend_name: str
    backend_id: str | None
    nodes: list[str]
    status: AttemptStatus
    exit_code: int | None
    exit_reason: str | None
    created_at: datetime
    finished_at: datetime | None
    failure: FailureClass | None
    log_tail: str | None

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> AttemptShown:
        """From `_DETAIL_IN_ONE`'s JSON object of one attempt (times as ISO text in any offset)."""
        return cls(number=doc["number"], backend_name=doc["backend_name"], backend_id=doc["backend_id"],
                   nodes=doc["nodes"], status=AttemptStatus(doc["status"]), exit_code=doc["exit_code"],
                   exit_reason=doc["exit_reason"], created_at=_utc_text(doc["created_at"]),
                   finished_at=None if doc["finished_at"] is None else _utc_text(doc["finished_at"]),
                   failure=None if doc["failure"] is None else FailureClass(doc["failure"]),
                   log_tail=doc["log_tail"])


@dataclass(frozen=True, slots=True)
class MeasuredShown:
    """The newest measurement of one kind, as `latest_measurements` gives it."""

    kind: MeasurementKind
    at: datetime
    data: dict[str, Any]

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> MeasuredShown:
        return cls(kind=MeasurementKind(doc["kind"]), at=_utc_text(doc["at"]), data=doc["data"])


def _utc_text(text: str) -> datetime:
    # PostgreSQL writes a timestamptz in JSON as ISO 8601 in the session's time zone.
    return as_utc(datetime.fromisoformat(text))


def _detail_in_one() -> Select[Any]:
    """PostgreSQL: `_DETAIL_JOB` with two more columns, the job's attempts in order of number and the
    newest measurement of each kind, each a JSONB array of objects (NULL for none): one round trip
    where the portable form takes three."""
    jobs, attempts, measured = Job.__table__, Attempt.__table__, Measurement.__table__

    def as_object(*columns: KeyedColumnElement[Any]) -> Any:
        pairs: list[ColumnElement[Any]] = []
        for c in columns:
            pairs += [literal_column(f"'{c.name}'"), c]
        return func.jsonb_build_object(*pairs)

    shown = [attempts.c[f.name] for f in fields(AttemptShown)]
    tries = (select(func.jsonb_agg(aggregate_order_by(as_object(*shown), attempts.c.number), type_=JSONB))
             .where(attempts.c.job_id == jobs.c.id).scalar_subquery())
    newest = (select(func.max(measured.c.id)).where(measured.c.job_id == jobs.c.id).group_by(measured.c.kind)
              .correlate(jobs))
    latest = (select(func.jsonb_agg(as_object(measured.c.kind, measured.c.at, measured.c.data), type_=JSONB))
              .where(measured.c.id.in_(newest)).scalar_subquery())
    return _DETAIL_JOB.add_columns(tries.label("attempts_json"), latest.label("measured_json"))


_DETAIL_IN_ONE = _detail_in_one()
#: `job_detail`'s first statement for a principal from `KnownTokens`: it checks the token too.
_DETAIL_JOB_CHECKED, _DETAIL_IN_ONE_CHECKED = _DETAIL_JOB.where(TOKEN_LIVE), _DETAIL_IN_ONE.where(TOKEN_LIVE)


@dataclass(frozen=True, slots=True)
class JobDetail:
    """What a job's detail shows: `job` (an ORM `Job`, or a Core row of every column of `jobs`, spec
    and plan decoded), its team's name, its attempts in order of number (objects or rows), and the
    newest measurement of each kind (rows of kind, at, data: `latest_measurements`)."""

    job: Any
    team: str
    attempts: Sequence[Any]
    measured: Sequence[Any]


def job_detail(conn: Connection, principal: Principal, job_id: int, live: LiveValues | None = None
               ) -> JobDetail:
    """The job with its attempts and newest measurements if `principal` may see it (`can_see`), else
    `NotFound`. Core reads with no ORM objects, run in `one_statement` (autocommit on PostgreSQL). On
    PostgreSQL one statement (`_DETAIL_IN_ONE`); on SQLite three, in `one_statement`'s transaction.

    `live` (`known_tokens.live_values`): `principal` comes from `KnownTokens`, and the first statement
    checks that its token works (`TOKEN_LIVE`); `Unproven` when it returns no row (no such job, or a
    token that no longer works: the caller authenticates the token and reads again)."""
    params: dict[str, Any] = {"job_id": job_id} if live is None else {"job_id": job_id, **live}
    if conn.dialect.name == "postgresql":
        row = conn.execute(_DETAIL_IN_ONE if live is None else _DETAIL_IN_ONE_CHECKED, params).first()
        if row is None and live is not None:
            raise Unproven
        if row is None or not can_see(principal, row):
            raise NotFound(f"no job {job_id}")
        return JobDetail(row, row.team_name, [AttemptShown.from_json(a) for a in row.attempts_json or ()],
                         [MeasuredShown.from_json(m) for m in row.measured_json or ()])
    job = conn.execute(_DETAIL_JOB if live is None else _DETAIL_JOB_CHECKED, params).first()
    if job is None and live is not None:
        raise Unproven
    if job is None or not can_see(principal, job):
        raise NotFound(f"no job {job_id}")
    return JobDetail(job, job.team_name, conn.execute(_DETAIL_ATTEMPTS, {"job_id": job_id}).all(),
                     latest_measurements(conn, job_id))


@dataclass(frozen=True, slots=True)
class JobFilter:
    """`gpu` is the GPU kind (`cpu` too); `created_after`/`created_before` bound the submission time."""

    status: Sequence[JobStatus] = ()
    team: str | None = None
    backend: BackendKind | None = None
    name: str | None = None
    gpu: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None


def _filter_values(principal: Principal, filters: JobFilter, *, status: bool = True
                   ) -> tuple[frozenset[str], dict[str, Any]]:
    """The filters that are set (their names: the shape of `_filtered`'s statement) and the values of
    every bind parameter `_filtered` reads for `principal` and `filters`, by name."""
    values: dict[str, Any] = {
        "status": list(filters.status) if status and filters.status else None,
        "team_name": filters.team or None, "backend": filters.backend or None, "name": filters.name or None,
        "gpu": filters.gpu or None, "created_after": filters.created_after, "created_before": filters.created_before}
    values = {name: value for name, value in values.items() if value is not None}
    return frozenset(values), {**values, **visibility_values(principal)}


def _filtered(stmt: Select[*Row], role: Role, names: frozenset[str]) -> Select[*Row]:
    """`stmt` (over `Job`) narrowed to what a principal of `role` may see and to the filters `names`
    (`_filter_values`), all values bind parameters: run it with `_filter_values`' values."""
    visible = visible_where(role)
    if visible is not None:
        stmt = stmt.where(visible)
    if "status" in names:
        stmt = stmt.where(Job.status.in_(bindparam("status", expanding=True)))
    if "team_name" in names:  # a scalar subquery, not a join: the (team_id, column, id) indexes then give the order
        stmt = stmt.where(Job.team_id == select(Team.id).where(Team.name == bindparam("team_name")).scalar_subquery())
    for name, column in (("backend", Job.backend), ("name", Job.name), ("gpu", Job.gpu)):
        if name in names:
            stmt = stmt.where(column == bindparam(name))
    if "created_after" in names:
        stmt = stmt.where(Job.created_at >= bindparam("created_after"))
    if "created_before" in names:
        stmt = stmt.where(Job.created_at < bindparam("created_before"))
    return stmt


def list_jobs(session: Session, principal: Principal, filters: JobFilter, *, limit: int = 50,
              cursor: JobCursor | None = None, sort: JobSort = DEFAULT_SORT) -> tuple[list[Job], JobCursor | None]:
    """A page of the jobs `principal` may see that match `filters`, in `sort`'s order (newest first by
    default), after `cursor`; and the cursor of the next page (None at the end). Keyset paging (see
    `service.store.job_sort`): every matching row comes exactly once across the pages. `cursor`
    must be of the same sort (`JobCursor.decode` checks that)."""
    return _page(session, _JOBS, principal, filters, limit, cursor, sort)


#: `list_jobs`' base: ORM objects.
_JOBS = select(Job)


def _summary_columns() -> Select[Any]:
    # The tables' own columns, not the ORM's attributes: a page's statement is built per request on
    # this one, and SQLAlchemy matches its result columns to the cached compiled statement's by dict
    # key. The ORM's annotated copies equal the table's columns by hash but not by identity, so each
    # lookup ran their `==`, which builds a SQL expression: 15% of a list request's CPU.
    jobs, teams = Job.__table__, Team.__table__
    return (select(jobs.c.id, jobs.c.name, jobs.c.team_id, jobs.c.status, jobs.c.backend, jobs.c.priority,
                   jobs.c.created_at, jobs.c.updated_at, jobs.c.finished_at, jobs.c.layout, jobs.c.predicted_step_s,
                   jobs.c.gpus, teams.c.name.label("team_name"))
            .join(teams, teams.c.id == jobs.c.team_id))


#: What a list shows of a job (`JobSummary`), with its team's name as `team_name`, and `gpus` for the sort.
_SUMMARY_COLUMNS = _summary_columns()


def list_job_rows(conn: Connection, principal: Principal, filters: JobFilter, *, limit: int = 50,
                  cursor: JobCursor | None = None, sort: JobSort = DEFAULT_SORT,
                  live: LiveValues | None = None) -> tuple[list[Any], JobCursor | None]:
    """`list_jobs`' page as rows of the list's columns (`team_name` among them), without an ORM
    session or an object per job: what `GET /v1/jobs` answers with. Most sorts are one statement; run
    it in `one_statement`. A sort read in several statements (`finished`, `team` across teams: see
    `segments`) sees what had committed when each started, as a READ COMMITTED transaction would.

    `live` (`known_tokens.live_values`): `principal` comes from `KnownTokens`, and the page's statement
    checks that its token works (`TOKEN_LIVE`); `Unproven` when it returns no row (an empty page, or a
    token that no longer works), or when the page takes several statements."""
    return _page(conn, _SUMMARY_COLUMNS, principal, filters, limit, cursor, sort, live)


def _page(source: Session | Connection, base: Select[*Row], principal: Principal, filters: JobFilter, limit: int,
          cursor: JobCursor | None, sort: JobSort, live: LiveValues | None = None
          ) -> tuple[list[Any], JobCursor | None]:
    """`list_jobs` over `base` (`_JOBS` or `_SUMMARY_COLUMNS`): ORM objects on a Session, else rows with
    `team_name` on a Connection. The statements come from `_page_statements`, built once per shape of
    request, and run with this request's values; with `live`, see `list_job_rows`."""
    limit = max(1, min(limit, MAX_PAGE))
    names, values = _filter_values(principal, filters)
    values.update(cursor_values(cursor))
    after = After.of(cursor)
    if sort.field is SortField.TEAM and principal.role == Role.ADMIN and not filters.team:
        if live is not None:
            raise Unproven  # several statements: a token that stopped working between them would cut the page short
        teams = _teams_from(source, sort, cursor)  # a statement per team: built for this request
        team = cursor.value if cursor is not None and isinstance(cursor.value, str) else None
        pages = _statements(base, principal.role, names, segments(sort, after, teams=teams, cursor_team=team))
    else:
        pages = _page_statements(base, principal.role, names, sort, after, live is not None)
        if live is not None:
            if len(pages) != 1:
                raise Unproven
            values.update(live)
    rows: list[Any] = []
    for page in pages:
        if len(rows) > limit:
            break
        params = {**values, "limit": limit + 1 - len(rows)}
        if isinstance(source, Session):
            rows += source.scalars(page, params)
        else:
            rows += source.execute(page, params).all()
    if not rows and live is not None:
        raise Unproven
    if len(rows) <= limit:
        return rows, None
    last = rows[limit - 1]
    return rows[:limit], cursor_after(sort, last, last.team.name if isinstance(source, Session) else last.team_name)


@functools.lru_cache(maxsize=1024)
def _page_statements(base: Select[*Row], role: Role, names: frozenset[str], sort: JobSort,
                     after: After, checked: bool = False) -> tuple[Select[*Row], ...]:
    """The statements of a page: built once for each shape of request, where building one took as
    long as running it (and SQLAlchemy then matched a new statement's columns to its cached compiled
    form on every execution). Every value is a bind parameter with no value of its own, so a run that
    left one out would fail, never reuse another request's. `checked`: each also checks the token
    (`TOKEN_LIVE`)."""
    return _statements(base, role, names, segments(sort, after), checked)


def _statements(base: Select[*Row], role: Role, names: frozenset[str],
                parts: list[Segment], checked: bool = False) -> tuple[Select[*Row], ...]:
    stmt = _filtered(base, role, names)
    if checked:
        stmt = stmt.where(TOKEN_LIVE)
    return tuple(stmt.where(*where).order_by(*order).limit(bindparam("limit")) for where, order in parts)


def _teams_from(source: Session | Connection, sort: JobSort, cursor: JobCursor | None) -> list[tuple[int, str]]:
    """(id, name) of every team in `sort`'s order of names, from the cursor's team on."""
    stmt = select(Team.id, Team.name).order_by(Team.name.desc() if sort.descending else Team.name.asc())
    if cursor is not None and isinstance(cursor.value, str):
        stmt = stmt.where(Team.name <= cursor.value if sort.descending else Team.name >= cursor.value)
    return [(int(team_id), str(name)) for team_id, name in source.execute(stmt)]


def jobs_after(session: Session, principal: Principal, filters: JobFilter, after_id: int, *,
               limit: int = 50) -> list[Job]:
    """Jobs newer than `after_id` matching `filters`, oldest first: what a live newest-first list prepends."""
    rows, _ = list_jobs(session, principal, filters, limit=limit, sort=DEFAULT_SORT.reversed(),
                        cursor=JobCursor(DEFAULT_SORT.reversed(), None, after_id))
    return rows


COUNT_CAP = 5_000


def count_jobs_by_status(session: Session, principal: Principal, filters: JobFilter, *,
                         cap: int = COUNT_CAP) -> tuple[dict[JobStatus, int], bool]:
    """Per status, how many of the newest `cap` jobs that `principal` may see match `filters` (all but
    the status filter), and whether more match than were counted. The cap bounds the cost of a filter
    that no index serves (a name and a time range over 100,000 jobs) to `cap` rows."""
    # one scan of at most cap + 1 rows: the extra one only says more match, and is taken off again
    names, values = _filter_values(principal, filters, status=False)
    matching = _filtered(select(Job.status, Job.id), principal.role, names).order_by(Job.id.desc())
    newest = matching.limit(cap + 1).subquery()
    rows = session.execute(select(newest.c.status, func.count(), func.min(newest.c.id))
                           .group_by(newest.c.status), values).all()
    counts = {JobStatus(s): int(n) for s, n, _ in rows}
    capped = sum(counts.values()) > cap
    if capped:  # the oldest row read is the extra one
        oldest = JobStatus(min(rows, key=lambda row: row[2])[0])
        counts[oldest] -= 1
        if not counts[oldest]:
            del counts[oldest]
    return counts, capped


def cancel_job(session: Session, principal: Principal, job_id: int) -> Job:
    """Idempotent: QUEUED -> CANCELLED now; SUBMITTING/PENDING/RUNNING -> CANCELLING (the dispatcher
    finishes it); CANCELLING or terminal: unchanged."""
    job = visible_job(session, principal, job_id, for_update=True, detail=True)  # the response shows it all
    status = job.status
    if status == JobStatus.QUEUED:
        transition(session, job, JobStatus.CANCELLED, actor=principal.actor, message="cancelled before submission")
    elif status in SUBMITTED:
        transition(session, job, JobStatus.CANCELLING, actor=principal.actor, message="cancel requested")
    return job


PRIORITY_EVENT = "job.priority"


def set_priority(session: Session, principal: Principal, job_id: int, priority: int) -> Job:
    """Change a job's priority (callers allow admins only; the range is the spec's, -1000 to 1000).
    Appends a `job.priority` event naming the old and new value, and drops the queue view so that
    `explain` answers from the new order. `Conflict` for a job that has ended."""
    job = visible_job(session, principal, job_id, for_update=True)
    if job.status in TERMINAL:
        raise Conflict(f"job {job_id} has ended ({job.status.value}): its priority no longer matters")
    old = job.priority
    if old != priority:
        job.priority = priority
        add_event(session, job, actor=principal.actor, kind=PRIORITY_EVENT,
                  message=f"priority changed from {old} to {priority}", data={"from": old, "to": priority})
        invalidate_queue_view(session)
    return job


def list_events(session: Session, job: Job, *, after: int = 0, limit: int = 500) -> list[Event]:
    """The job's events after id `after`, oldest first, up to the `committed_horizon` (so a reader's
    cursor never skips an event committed later)."""
    stmt = select(Event).where(Event.job_id == job.id, Event.id > after).order_by(Event.id).limit(limit)
    horizon = committed_horizon(session)
    if horizon is not None:
        stmt = stmt.where(Event.id <= horizon)
    return list(session.scalars(stmt))


def add_measurement(session: Session, principal: Principal, job: Job, kind: MeasurementKind,
                    data: dict[str, Any]) -> Measurement:
    row = Measurement(job_id=job.id, kind=kind, data=data)
    session.add(row)
    if kind != MeasurementKind.HEARTBEAT:
        add_event(session, job, actor=principal.actor, kind=EventKind.measurement(kind), message=f"{kind} received")
    session.flush()
    return row


def _heartbeat_insert(*, team: bool, checked: bool = False) -> Insert:
    """INSERT INTO measurements ... SELECT FROM jobs WHERE id = :job_id [AND team_id = :team_id]
    [AND the token works: `TOKEN_LIVE`]."""
    jobs, measurements = Job.__table__, Measurement.__table__
    source = select(jobs.c.id, bindparam("kind", type_=measurements.c.kind.type),
                    bindparam("at", type_=measurements.c.at.type),
                    bindparam("data", type_=measurements.c.data.type)).where(jobs.c.id == bindparam("job_id"))
    if team:
        source = source.where(jobs.c.team_id == bindparam("team_id"))
    if checked:
        source = source.where(TOKEN_LIVE)
    return insert(Measurement).from_select(["job_id", "kind", "at", "data"], source).returning(Measurement.id)


#: Built once (a running job sends one every few seconds): for admins and job tokens, and for members;
#: each also checking the token, for a principal from `KnownTokens`.
_HEARTBEAT, _HEARTBEAT_CHECKED = _heartbeat_insert(team=False), _heartbeat_insert(team=False, checked=True)
_TEAM_HEARTBEAT, _TEAM_HEARTBEAT_CHECKED = _heartbeat_insert(team=True), _heartbeat_insert(team=True, checked=True)


def add_heartbeat(conn: Connection, principal: Principal, job_id: int, data: dict[str, Any], *, at: datetime,
                  live: LiveValues | None = None) -> None:
    """Store a heartbeat of job `job_id` with `data` at `at`. The same rule as
    `visible_job`: a job the principal may not see, or that does not exist, is `NotFound` and nothing is
    stored. One statement and no job loaded (a heartbeat comes from every running job every few
    seconds): the row is inserted from the job's row, which the principal's rule filters. No event,
    as `add_measurement` writes none for a heartbeat. `conn` is a Core connection (one statement: it
    needs no transaction, see `service.store.db.one_statement`).

    `live` (`known_tokens.live_values`): `principal` comes from `KnownTokens`, and the insert checks
    that its token works (`TOKEN_LIVE`); `Unproven`, not `NotFound`, whenever nothing is stored (the
    caller authenticates the token and goes again)."""
    missing: Exception = NotFound(f"no job {job_id}") if live is None else Unproven()
    if principal.role == Role.JOB and principal.job_id != job_id:
        raise missing
    values = {"kind": MeasurementKind.HEARTBEAT, "at": at, "data": data, "job_id": job_id, **(live or {})}
    if principal.role == Role.MEMBER:
        insert_team = _TEAM_HEARTBEAT if live is None else _TEAM_HEARTBEAT_CHECKED
        stored = conn.execute(insert_team, {**values, "team_id": principal.team_id}).first()
    else:
        stored = conn.execute(_HEARTBEAT if live is None else _HEARTBEAT_CHECKED, values).first()
    if stored is None:
        raise missing


def latest_measurements(source: Session | Connection, job_id: int) -> list[Any]:
    """The newest measurement of each kind, as rows of (kind, at, data). On a Session it flushes first,
    so measurements added in its transaction count."""
    return list(source.execute(_NEWEST_MEASURED, {"job_id": job_id}).all())


def is_terminal(job: Job) -> bool:
    return job.status in TERMINAL


def count_by_status_and_team(session: Session) -> list[tuple[JobStatus, str, int]]:
    stmt = (select(Job.status, Team.name, func.count()).join(Team, Team.id == Job.team_id)
            .group_by(Job.status, Team.name))
    return [(s, t, int(n)) for s, t, n in session.execute(stmt)]

