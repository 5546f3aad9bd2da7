"""The reconcile phase: every tracked job's current attempt read in one query, one `poll` per backend,
and `service.lifecycle_decide.decide` per job on what its backend observed. A job whose answer is
`NO_CHANGE` costs no transaction (with 10,000 tracked jobs nearly all are unchanged every cycle); the
others are locked and read again, decided again on what is then stored, and their changes written
(`apply_many`). A backend that cannot be reached is "unknown for now": its jobs stay as they are.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import threading
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass

from sqlalchemy import DateTime, Text, cast, func, or_, select, type_coerce
from sqlalchemy.orm import Session, aliased, selectinload

from service.failures import OUT_OF_MEMORY
from service.lifecycle import TRACKED
from service.lifecycle_decide import (
    NO_CHANGE,
    NOT_COUNTED,
    AttemptFacts,
    Changes,
    JobFacts,
    Note,
    counts_against_max_attempts,
    decide,
)
from service.store.backend_pending import ChangeKey, last_backend_pending
from service.store.models import Attempt, Job, utcnow
from service.store.states import add_event, transition
from service.store.vocab import AttemptStatus, FailureClass, JobStatus
from workers.backends.base import BackendUnavailable, Handle, Observation, TransientBackendError
from workers.dispatch.context import Context, CycleReport
from workers.dispatch.preempt import resend_notices
from workers.dispatch.replan import replan_after_oom

log = logging.getLogger("shardctl.dispatcher")
S = JobStatus
#: jobs whose observations one transaction writes (`apply_many`)
APPLY_CHUNK = 200

_collector_lock = threading.Lock()
_collector_pausers = 0
_collector_was_enabled = False


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector's automatic passes held off while the block runs (process-wide; nested
    and concurrent blocks share one pause, and the collector's state before the first is restored after
    the last). Memory is still freed by reference counting; cyclic garbage made meanwhile is collected by
    the first automatic pass after the block. A reconcile cycle holds ~10^5 container objects alive at
    once (the Kubernetes lists, the tracked rows, the observations), so each full pass started inside it
    walks all of them: two or three of those were about a third of a 10,000-job cycle's CPU."""
    global _collector_pausers, _collector_was_enabled
    with _collector_lock:
        if _collector_pausers == 0:
            _collector_was_enabled = gc.isenabled()
            gc.disable()
        _collector_pausers += 1
    try:
        yield
    finally:
        with _collector_lock:
            _collector_pausers -= 1
            if _collector_pausers == 0 and _collector_was_enabled:
                gc.enable()


@dataclass(slots=True)
class Tracked:
    """A tracked job (PENDING, RUNNING or CANCELLING) and its current attempt, as a cycle read them: what
    `decide` reads, and the attempt's id and backend handle."""

    job_id: int
    attempt_id: int
    handle: Handle
    job: JobFacts
    attempt: AttemptFacts

    @property
    def marked_preempted(self) -> bool:
        """Told to stop by `workers.dispatch.preempt` and not ended yet."""
        return self.attempt.failure == FailureClass.PREEMPTED and not self.attempt.ended


def reconcile(ctx: Context, report: CycleReport) -> None:
    """One read of every tracked job's current attempt, one `poll` per backend, and writes only for the
    jobs whose observation changes the store (`decide` answers other than `NO_CHANGE`), `APPLY_CHUNK` jobs
    per transaction (`apply_many`). CANCELLING jobs are cancelled on their backend again, and attempts
    marked as preempted given notice again (`resend_notices`). The garbage collector's automatic passes
    wait until it ends (`collector_paused`)."""
    with collector_paused():
        _reconcile(ctx, report)


def _reconcile(ctx: Context, report: CycleReport) -> None:
    rows = _tracked(ctx)
    by_backend: dict[str, list[Tracked]] = defaultdict(list)
    marked: dict[str, list[tuple[int, Handle]]] = defaultdict(list)
    for row in rows:
        by_backend[row.job.backend].append(row)
        if row.marked_preempted and row.job.status != S.CANCELLING:
            marked[row.job.backend].append((row.attempt_id, row.handle))
    changed: list[tuple[int, int, Observation]] = []
    policy = ctx.policy
    for backend_name, items in by_backend.items():
        backend = ctx.backends.get(backend_name)
        if backend is None:
            continue
        for row in items:
            if row.job.status == S.CANCELLING:
                with contextlib.suppress(BackendUnavailable, TransientBackendError):  # again next cycle
                    backend.cancel(row.handle)
        resend_notices(ctx, backend, marked.get(backend_name, []))
        try:
            observed = backend.poll([row.handle for row in items])
        except BackendUnavailable:
            report.unreachable.append(backend_name)
            continue
        except TransientBackendError as exc:  # answered but busy: unknown for now, like an outage
            log.warning("%s could not be polled this cycle: %s", backend_name, exc)
            continue
        now = utcnow()
        for row in items:
            obs = observed.get(row.handle.name)
            if obs is not None and decide(row.job, row.attempt, obs, now=now, policy=policy) is not NO_CHANGE:
                changed.append((row.job_id, row.attempt.number, obs))
    for lo in range(0, len(changed), APPLY_CHUNK):
        report.transitions += apply_many(ctx, changed[lo:lo + APPLY_CHUNK])


def _tracked(ctx: Context) -> list[Tracked]:
    """Every tracked job with its current attempt, in one query of Core rows (the attempt's `nodes` read
    as JSON text and decoded here, its end and start as whether they are recorded)."""
    older, same, prior = aliased(Attempt), aliased(Attempt), aliased(Attempt)
    latest = select(func.max(older.number)).where(older.job_id == Job.id).correlate(Job).scalar_subquery()
    runs = (select(func.count(same.id)).where(same.job_id == Job.id, same.backend_id == Attempt.backend_id)
            .correlate(Job, Attempt).scalar_subquery())
    counted = (select(func.count(prior.id))
               .where(prior.job_id == Job.id, prior.number < Attempt.number,
                      or_(prior.failure.is_(None), prior.failure.not_in(NOT_COUNTED)))
               .correlate(Job, Attempt).scalar_subquery())
    with ctx.sessions.begin() as session:
        result = session.connection().execute(
            select(Job.id, Job.backend, Job.status, counted, Attempt.number, Attempt.backend_name,
                   Attempt.backend_id, Attempt.id, Attempt.failure, Attempt.exit_reason,
                   Attempt.finished_at.is_not(None), Attempt.started_at.is_not(None),
                   type_coerce(Attempt.created_at, DateTime(timezone=True)), cast(Attempt.nodes, Text), runs)
            .join(Attempt, Attempt.job_id == Job.id)
            .where(Job.status.in_(TRACKED), Attempt.number == latest)).all()
    jobs: dict[tuple[JobStatus, str, int], JobFacts] = {}  # few distinct values: one object each
    out = []
    for (job_id, kind, status, n_counted, number, name, backend_id, attempt_id, failure, exit_reason, ended,
         started, created_at, nodes, n_runs) in result:
        job = jobs.get((status, kind, n_counted))
        if job is None:
            job = jobs[(status, kind, n_counted)] = JobFacts(status, kind, n_counted)
        out.append(Tracked(
            job_id, attempt_id, Handle(name=name, backend_id=backend_id), job,
            AttemptFacts(number, backend_id, int(n_runs or 1), failure, exit_reason, ended, started, created_at,
                         None if nodes is None else json.loads(nodes), _pending_key(ctx, job_id, number))))
    return out


def _pending_key(ctx: Context, job_id: int, number: int) -> ChangeKey | None:
    """The backend's reason and estimate this dispatcher last recorded for attempt `number` of the job
    (`AttemptFacts.pending_key`); None when it recorded none for that attempt."""
    remembered = ctx.backend_pending.get(job_id)
    return remembered[1] if remembered is not None and remembered[0] == number else None


def apply(ctx: Context, job_id: int, number: int, obs: Observation) -> int:
    """Write what the backend observed of attempt `number` of job `job_id`; return 1 when the job's status
    changed, else 0."""
    return apply_many(ctx, [(job_id, number, obs)])


def apply_many(ctx: Context, observed: list[tuple[int, int, Observation]]) -> int:
    """`apply` for several jobs in one transaction: their rows are locked in id order (replicas never
    deadlock) and read with their attempts in two queries. A crash before the commit leaves all of
    them as they were, and the next cycle observes them again. Should one job's write fail, the
    chunk is rolled back and each job is applied in its own transaction, so one bad row does not hold
    back the others. An out-of-memory end is applied in a transaction of its own after the others: it
    may re-plan the job (up to the planner's budget) while its row is locked, and the other rows should
    not wait for that. Returns the number of jobs whose status changed."""
    single, changed = len(observed) == 1, 0
    if not single:
        together = [item for item in observed if item[2].failure not in OUT_OF_MEMORY]
        alone = [item for item in observed if item[2].failure in OUT_OF_MEMORY]
        try:
            changed = _apply_in_one_transaction(ctx, together) if together else 0
            observed = alone
        except Exception:
            log.exception("applying %d observations together failed; applying them one by one", len(together))
    for item in observed:
        try:
            changed += _apply_in_one_transaction(ctx, [item])
        except Exception:
            if single:
                raise
            log.exception("job %d: applying its observation failed", item[0], extra={"job_id": item[0]})
    return changed


def _apply_in_one_transaction(ctx: Context, observed: list[tuple[int, int, Observation]]) -> int:
    ids = sorted({job_id for job_id, _, _ in observed})
    remembered = {job_id: ctx.backend_pending.get(job_id) for job_id in ids}
    try:
        with ctx.sessions.begin() as session:
            stmt = select(Job).where(Job.id.in_(ids)).order_by(Job.id).options(selectinload(Job.attempts))
            if ctx.postgres:
                stmt = stmt.with_for_update(of=Job)
            jobs = {job.id: job for job in session.scalars(stmt)}
            return sum(_apply_loaded(ctx, session, jobs.get(job_id), number, obs)
                       for job_id, number, obs in observed)
    except BaseException:  # nothing was recorded: neither may this dispatcher's memory of it be
        for job_id, value in remembered.items():
            if value is None:
                ctx.backend_pending.pop(job_id, None)
            else:
                ctx.backend_pending[job_id] = value
        raise


def _apply_loaded(ctx: Context, session: Session, job: Job | None, number: int, obs: Observation) -> int:
    """`apply` on a job read (and locked) in `session`: `decide` on its facts, and its changes written."""
    if job is None or job.status not in TRACKED or not job.attempts or job.attempts[-1].number != number:
        return 0
    attempt, status = job.attempts[-1], job.status
    runs = sum(1 for a in job.attempts if a.backend_id == attempt.backend_id) if attempt.backend_id else 1
    facts = AttemptFacts(number, attempt.backend_id, runs, attempt.failure, attempt.exit_reason,
                         attempt.finished_at is not None, attempt.started_at is not None, attempt.created_at,
                         attempt.nodes, _pending_key(ctx, job.id, number))
    counted = sum(1 for a in job.attempts[:-1] if counts_against_max_attempts(a.failure))
    changes = decide(JobFacts(status, job.backend, counted), facts, obs, now=utcnow(), policy=ctx.policy)
    if changes is not NO_CHANGE:
        _write(ctx, session, job, changes)
    if job.status != S.PENDING:
        ctx.backend_pending.pop(job.id, None)
    return int(job.status != status)


def _write(ctx: Context, session: Session, job: Job, changes: Changes) -> None:
    """Write `changes` (in the order `Changes` states) to `job`, locked in `session`."""
    attempt = job.attempts[-1]
    for requeue in changes.requeues:
        marked = requeue.marked
        attempt.status, attempt.failure, attempt.finished_at = (AttemptStatus.PREEMPTED, FailureClass.PREEMPTED,
                                                                requeue.finished_at)
        attempt.exit_reason = f"{marked}; requeued: {requeue.reason}" if marked else f"requeued: {requeue.reason}"
        nxt = Attempt(job_id=job.id, number=attempt.number + 1, backend_name=attempt.backend_name,
                      backend_id=attempt.backend_id, status=AttemptStatus.PENDING, nodes=[],
                      failure=FailureClass.PREEMPTED if marked else None, exit_reason=marked)
        session.add(nxt)
        job.attempts.append(nxt)
        attempt = nxt
    for note in changes.events:
        add_event(session, job, actor=ctx.actor, kind=note.kind, message=note.message, data=note.data)
    if changes.started_at is not None:  # usage counts from here
        attempt.started_at = changes.started_at
    if changes.pending is not None and changes.pending_key is not None:
        _note_backend_pending(ctx, session, job, attempt.number, changes.pending, changes.pending_key)
    if changes.nodes:
        attempt.nodes = changes.nodes
    if changes.running:
        attempt.status = AttemptStatus.RUNNING
    end = changes.end
    if end is not None:
        attempt.status, attempt.failure, attempt.exit_code, attempt.exit_reason = (
            end.status, end.failure, end.exit_code, end.reason)
        attempt.log_tail, attempt.finished_at = end.log_tail, end.finished_at
        if end.started_at_creation:  # its GPUs were held since it was handed over (an upper bound)
            attempt.started_at = attempt.created_at
    replanned = (changes.replan and end is not None
                 and replan_after_oom(session, job, end, changes.moves[-1].data, actor=ctx.actor))
    for move in () if replanned else changes.moves:
        transition(session, job, move.status, actor=ctx.actor, message=move.message, data=move.data)
    if changes.moves and job.status == S.QUEUED:
        job.lease_owner = job.lease_expires_at = None
        job.not_before = None if replanned else changes.not_before


def _note_backend_pending(ctx: Context, session: Session, job: Job, number: int, note: Note, key: ChangeKey) -> None:
    """Append `note` (`job.backend_pending`) unless the store's last one for attempt `number` has the same
    `key` (another replica, or this dispatcher before a restart, recorded it), and remember `key` for the
    job: a job that waits for hours writes once per change, not once per cycle."""
    last = last_backend_pending(session, job.id, number)
    if (last.key if last is not None else (None, None)) != key:
        add_event(session, job, actor=ctx.actor, kind=note.kind, message=note.message, data=note.data)
    ctx.backend_pending[job.id] = (number, key)
