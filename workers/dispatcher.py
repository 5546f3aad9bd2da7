"""The dispatcher: turns queued jobs into backend submissions, exactly once, and keeps their status true.

One cycle (`run_once`):

1. **Lease** up to `batch` jobs that are QUEUED (or SUBMITTING with an expired lease: a dispatcher
   died mid-submission) by writing this dispatcher's name and a lease expiry. PostgreSQL takes the
   rows with `FOR UPDATE SKIP LOCKED`, so replicas never wait on each other; SQLite serialises
   writers (`BEGIN IMMEDIATE`), and the lease expiry works on both.
2. **Submit** each leased job: in one transaction write SUBMITTING and the attempt row (its name
   `shardctl-<job id>-<n>` is deterministic) and commit; then, outside any transaction, ask the
   backend for that name (`find`) and adopt it if it exists, else `submit`; then commit PENDING
   with the backend's id. A crash between any two steps leaves a SUBMITTING job whose lease
   expires; the next dispatcher finds the name and adopts it, so nothing is submitted twice.
3. **Reconcile** every tracked job with one `poll` per backend, and apply what changed as state
   transitions (each one an event). A backend that cannot be reached is "unknown for now".
   Failures a retry can fix (`service.failures.RETRIED`: node_failure, preempted, lost, capacity) go
   back to QUEUED with backoff, up to `max_attempts`; the others (program_error, oom_gpu, oom_host,
   launch_error, timeout) fail the job. Each closed attempt keeps its class, the program's exit code,
   the reason and the program's last lines (docs/failures.md). CANCELLING jobs are cancelled on the
   backend until it confirms. (A job's token stops working `job_token_grace_s` after the job ends:
   `service.store.tokens.authenticate` derives it.)
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import socket
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import SecretStr
from sqlalchemy import DateTime, Text, cast, func, select, type_coerce
from sqlalchemy.orm import Session, aliased, selectinload, sessionmaker

from service.failures import OUT_OF_MEMORY, measured_oom
from service.jobenv import JobEnv
from service.lifecycle import PREEMPTIBLE, TRACKED, UNSUBMITTED
from service.observability import counters
from service.planner import replan
from service.planner.result import Plan
from service.redaction import redact_strings
from service.scheduling.kueue_names import KueueQueue
from service.scheduling.snapshot import SnapshotParams
from service.spec import TrainingSpec
from service.store.backend_pending import ChangeKey, change_key, last_backend_pending
from service.store.models import Attempt, Job, as_utc, utcnow
from service.store.pools import kueue_queue_for
from service.store.states import add_event, transition
from service.store.tokens import create_token
from service.store.vocab import AttemptStatus, EventKind, FailureClass, JobStatus, Role
from workers import admission
from workers.backends.base import (
    Backend,
    BackendUnavailable,
    Handle,
    LaunchRequest,
    Observation,
    RunState,
    SubmissionRefused,
    TransientBackendError,
    attempt_name,
    runtime_command,
)
from workers.queue_view import QueueViewWriter
from workers.steady import TrackedRow, changes_store

log = logging.getLogger("shardctl.dispatcher")
LaunchPreview = Callable[[TrainingSpec, Plan], dict[str, Any] | None]
FAILPOINT_ENV = "SHARDCTL_FAILPOINT"


def failpoint(name: str) -> None:
    """Crash-test hook: when $SHARDCTL_FAILPOINT names this point, die here by SIGKILL (no cleanup),
    as a machine failure would. Points: after-submitting-commit, after-backend-answer, after-preempt-mark."""
    if os.environ.get(FAILPOINT_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
S = JobStatus
MISSING_GRACE = timedelta(seconds=60)
#: jobs whose observations one transaction writes (`Dispatcher.apply_many`)
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


@dataclass
class DispatcherConfig:
    owner: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")
    lease_s: float = 60.0
    batch: int = 16
    max_attempts: int = 3
    retry_backoff_s: float = 5.0
    api_url: str | None = None
    preempt_grace_s: float = 30.0  # notice a preempted job gets to checkpoint before it is killed
    #: what admission reads besides the store (local GPUs, usage half-life, blend, minimum runtime)
    scheduling: SnapshotParams = field(default_factory=SnapshotParams)


@dataclass
class CycleReport:
    submitted: int = 0
    adopted: int = 0
    transitions: int = 0
    unreachable: list[str] = field(default_factory=list)


def build_request(job_id: int, number: int, *, plan: Plan, spec: TrainingSpec, team: str,
                  token: str | None, api_url: str | None, kueue: KueueQueue | None = None) -> LaunchRequest:
    """The launch request for attempt `number` of a job: the world from the plan, the entrypoint from
    the spec (the built-in runtime when absent), and the job contract every rank gets. `kueue`: the
    LocalQueue and priority class when the job's pool is Kueue-managed (`kueue_queue_for(job.pool)`)."""
    layout = plan.layout
    nodes, per_node = plan.nodes, plan.gpus_per_node
    if nodes * per_node != layout.world_size:
        per_node = max(1, layout.world_size // nodes)
    entry = spec.entrypoint
    job = JobEnv(job_id=job_id, attempt=number, plan=plan, api_url=api_url,
                 token=SecretStr(token) if token is not None else None)
    return LaunchRequest(job=job, name=attempt_name(job_id, number), team=team, nodes=nodes,
                         procs_per_node=per_node, gpus_per_proc=0 if plan.gpu == "cpu" else 1,
                         command=list(entry.command) if entry else runtime_command(),
                         user_env=dict(entry.env) if entry else {}, image=entry.image if entry else None,
                         options=spec.backend, kueue=kueue)


def launch_preview(backends: Mapping[str, Backend], api_url: str | None = None) -> LaunchPreview:
    """A function that renders what attempt 1 of a not-yet-created job would send to its backend
    (`POST /v1/plans`, `shardctl submit --dry-run`); None when the spec's backend is not configured.
    It raises `ValueError` with the backend's reason when the backend would refuse the request (the
    API, which never imports backends, answers that as a 422)."""

    def preview(spec: TrainingSpec, plan: Plan) -> dict[str, Any] | None:
        backend = backends.get(spec.backend.kind)
        if backend is None:
            return None
        req = build_request(0, 1, plan=plan, spec=spec, team=spec.team or "default",
                            token="<job token, minted at submission>", api_url=api_url)
        try:  # every backend's preview is redacted by value as well as by name
            return dict(redact_strings(backend.render(req).model_dump(mode="json")))
        except SubmissionRefused as exc:
            raise ValueError(str(exc)) from exc

    return preview


class Dispatcher:
    """Leases, submits and reconciles jobs against `backends` (keyed by `spec.backend.kind`)."""

    def __init__(self, sessions: sessionmaker[Session], backends: Mapping[str, Backend],
                 config: DispatcherConfig | None = None) -> None:
        self.sessions = sessions
        self.backends = dict(backends)
        self.config = config or DispatcherConfig()
        self._postgres = sessions.kw["bind"].dialect.name == "postgresql"
        #: job id -> (attempt, the backend's pending reason/estimate last recorded): `_note_backend_pending`
        self._backend_pending: dict[int, tuple[int, ChangeKey]] = {}
        #: attempts this process gave preemption notice to (`preempt`, `_resend_notices`)
        self._notice_sent: set[int] = set()
        #: "why pending" as a lookup: the queue view, refreshed after each cycle (`workers.queue_view`)
        self.queue_view = QueueViewWriter(sessions, self.config.scheduling)

    @property
    def actor(self) -> str:
        return f"dispatcher:{self.config.owner}"

    # -- one cycle -------------------------------------------------------------------------------

    def run_once(self) -> CycleReport:
        started, ok = time.perf_counter(), False
        try:
            report = CycleReport()
            for job_id in self.lease():
                log.info("job %d leased by %s", job_id, self.config.owner,
                         extra={"job_id": job_id, "decision": "leased", "owner": self.config.owner})
                self.submit_one(job_id, report)
            self.reconcile(report)
            ok = True
            self._refresh_queue_view()
            return report
        finally:  # shardctl_dispatcher_cycle_seconds (docs/observability.md)
            counters.observe_cycle(time.perf_counter() - started, ok=ok)

    def _refresh_queue_view(self) -> None:
        try:
            self.queue_view.maybe_refresh()
        except Exception:  # the view is a cache: explain answers live while it is missing or old
            log.exception("queue view refresh failed; explain answers live until one succeeds")

    def run_forever(self, stop: threading.Event, interval_s: float = 1.0) -> None:
        while not stop.is_set():
            try:
                self.run_once()
            except Exception:
                log.exception("dispatcher cycle failed; continuing")
            stop.wait(interval_s)

    # -- leasing and submission ----------------------------------------------------------------

    def lease(self) -> list[int]:
        """Take up to `batch` submittable jobs: those that hold an admission already (an interrupted
        submission, an admitted job not yet leased, a backend admission does not manage), then those
        the scheduling engine admits now, in its order (`workers.admission`). Returns their ids.
        The preemptions the decision asks for are carried out after it commits (`preempt`); a backend
        that cannot be reached leaves the victim running, and the next cycle decides again."""
        with self.sessions.begin() as session:
            leased = admission.lease(session, now=utcnow(), owner=self.config.owner, lease_s=self.config.lease_s,
                                     batch=self.config.batch, params=self.config.scheduling)
        for chosen in leased.decision.preempted if leased.decision is not None else []:
            try:
                self.preempt(chosen.victim, by=chosen.by, reason=chosen.reason)
            except (BackendUnavailable, TransientBackendError) as exc:
                log.warning("job %d not preempted this cycle: %s", chosen.victim, exc,
                            extra={"job_id": chosen.victim, "decision": "preempt_failed", "by": chosen.by})
        return leased.ids

    def _owned(self, session: Session, job_id: int) -> Job | None:
        job = session.get(Job, job_id, with_for_update=self._postgres)
        if job is None or job.lease_owner != self.config.owner:
            return None
        return job

    def submit_one(self, job_id: int, report: CycleReport) -> None:
        """SUBMITTING and the attempt row, committed; then find-or-submit outside any transaction;
        then PENDING with the backend's id."""
        with self.sessions.begin() as session:
            job = self._owned(session, job_id)
            if job is None or job.status not in UNSUBMITTED:
                return
            backend = self.backends.get(job.backend)
            if backend is None:  # the API checks at submit; the configuration changed since
                if job.status == S.QUEUED:
                    transition(session, job, S.SUBMITTING, actor=self.actor)
                transition(session, job, S.FAILED, actor=self.actor,
                           message=f"backend {job.backend!r} is not configured on this dispatcher",
                           data={"configured": sorted(self.backends)})
                job.lease_owner = job.lease_expires_at = None
                return
            if job.status == S.QUEUED:
                number = len(job.attempts) + 1
                session.add(Attempt(job_id=job.id, number=number, backend_name=attempt_name(job.id, number),
                                    status=AttemptStatus.SUBMITTING, nodes=[]))
                transition(session, job, S.SUBMITTING, actor=self.actor,
                           message=f"attempt {number} to {job.backend}", data={"attempt": number})
            else:
                number = len(job.attempts)
                add_event(session, job, actor=self.actor, kind=EventKind.RESUME_SUBMIT,
                          message=f"resuming attempt {number} after an interrupted submission")
            _, token = create_token(session, role=Role.JOB, job_id=job.id, name=attempt_name(job.id, number))
            req = build_request(job.id, number, plan=job.plan, spec=job.spec, team=job.team.name, token=token,
                                api_url=self.config.api_url,
                                kueue=kueue_queue_for(session, job.pool, job.team.name, job.priority))
        failpoint("after-submitting-commit")
        try:
            handle = backend.find(req.name)
            adopted = handle is not None
            if handle is None:
                handle = backend.submit(req)
        except BackendUnavailable as exc:
            self._release(job_id, f"{job.backend} unreachable: {exc}", report)
            report.unreachable.append(job.backend)
            return
        except TransientBackendError as exc:
            self._release(job_id, f"{job.backend} could not take the submission now: {exc}", report)
            return
        except SubmissionRefused as exc:
            log.warning("%s refused %s: %s", job.backend, req.name, exc)
            with self.sessions.begin() as session:
                job = self._owned(session, job_id)
                if job is not None and job.status == S.SUBMITTING:
                    refused = job.attempts[-1]
                    refused.status, refused.failure, refused.exit_reason, refused.finished_at = (
                        AttemptStatus.FAILED, FailureClass.LAUNCH_ERROR, str(exc), utcnow())
                    transition(session, job, S.FAILED, actor=self.actor,
                               message=f"{FailureClass.LAUNCH_ERROR}: {job.backend} refused the submission: {exc}",
                               data={"failure": FailureClass.LAUNCH_ERROR.value, "reason": str(exc)})
                    job.lease_owner = job.lease_expires_at = None
            return
        failpoint("after-backend-answer")
        with self.sessions.begin() as session:
            job = session.get(Job, job_id, with_for_update=self._postgres)
            assert job is not None
            attempt = job.attempts[-1]
            attempt.backend_id = handle.backend_id
            if job.status == S.SUBMITTING:
                attempt.status = AttemptStatus.PENDING
                transition(session, job, S.PENDING, actor=self.actor,
                           message=("adopted" if adopted else "submitted") + f" {req.name}",
                           data={"backend_id": handle.backend_id, "adopted": adopted})
                report.transitions += 1
            job.lease_owner = job.lease_expires_at = None
        if adopted:
            report.adopted += 1
        else:
            report.submitted += 1
        log.info("job %d %s as %s on %s (%s)", job_id, "adopted" if adopted else "submitted", req.name, job.backend,
                 handle.backend_id, extra={"job_id": job_id, "decision": "adopted" if adopted else "submitted",
                                           "attempt": req.job.attempt, "backend": str(job.backend),
                                           "backend_id": handle.backend_id})

    def _release(self, job_id: int, why: str, report: CycleReport) -> None:
        """Keep the job SUBMITTING, let the lease run out after a backoff, and say why."""
        with self.sessions.begin() as session:
            job = self._owned(session, job_id)
            if job is None:
                return
            add_event(session, job, actor=self.actor, kind=EventKind.BACKEND_UNREACHABLE, message=why)
            job.lease_owner = None
            job.lease_expires_at = utcnow() + timedelta(seconds=self.config.retry_backoff_s)
        log.warning("job %d released, tried again in %.0f s: %s", job_id, self.config.retry_backoff_s,
                    redact_strings(why),
                    extra={"job_id": job_id, "decision": "released", "backoff_s": self.config.retry_backoff_s})

    # -- preemption ----------------------------------------------------------------------------

    def preempt(self, job_id: int, *, by: int, reason: str) -> None:
        """Stop job `job_id`'s current attempt with notice, because job `by` needs its devices (`reason` says
        why, for people). Called by admission; safe to call from any dispatcher replica.

        In one transaction: the attempt is marked as being preempted (its `failure` is `preempted` while it
        still runs, with `exit_reason` "preempted by job <by>: <reason>"), so it is never chosen twice, and
        a `job.preempted` event names who and why. Then, outside it, the backend is asked to stop it with
        `preempt_grace_s` of notice (`Backend.preempt`: SIGTERM, the kill after the grace period). When the
        backend reports the end, the job goes back to QUEUED at once, keeps its place (admission orders by
        submission time), gives its admission back (no `pool`: admission must admit it again) and the
        preempted attempt does not count against `max_attempts`; the next attempt resumes from the job's
        checkpoint (every backend's `preempt` ends the run for good; on Slurm, `scancel`, so Slurm never
        starts it again by itself). A job that is not PENDING or RUNNING, or
        is already being preempted, is left alone. If the backend cannot be reached the mark is undone
        (the caller may choose again) and the backend's error is raised."""
        grace = self.config.preempt_grace_s
        marked = self._mark_preempted(job_id, by=by, reason=reason)
        if marked is None:
            return
        attempt_id, backend, handle = marked
        failpoint("after-preempt-mark")
        try:
            backend.preempt(handle, grace)
            self._notice_sent.add(attempt_id)
        except (BackendUnavailable, TransientBackendError) as exc:
            with self.sessions.begin() as session:
                undo = session.get(Attempt, attempt_id)
                job = session.get(Job, job_id)
                if undo is not None and job is not None and undo.finished_at is None:
                    undo.failure = undo.exit_reason = None
                    add_event(session, job, actor=self.actor, kind=EventKind.BACKEND_UNREACHABLE,
                              message=f"the preemption of attempt {undo.number} was not delivered: {exc}")
            raise

    def _mark_preempted(self, job_id: int, *, by: int, reason: str) -> tuple[int, Backend, Handle] | None:
        """The first step of `preempt`, in one transaction: mark the current attempt and write the event.
        Returns what the second step needs (attempt id, backend, handle), or None to leave the job alone."""
        grace = self.config.preempt_grace_s
        with self.sessions.begin() as session:
            job = session.get(Job, job_id, with_for_update=self._postgres)
            backend = self.backends.get(job.backend) if job is not None else None
            if job is None or backend is None or job.status not in PREEMPTIBLE or not job.attempts:
                log.info("not preempting job %s: it is not running here", job_id)
                return None
            attempt = job.attempts[-1]
            if attempt.failure == FailureClass.PREEMPTED or attempt.finished_at is not None:
                return None
            attempt.failure = FailureClass.PREEMPTED
            # the victim's team reads this: another team's job is named by its team only, never its id
            preemptor = session.get(Job, by)
            other_team = preemptor.team.name if preemptor is not None and preemptor.team_id != job.team_id else None
            who = f"a job of team {other_team}" if other_team is not None else f"job {by}"
            attempt.exit_reason = f"preempted by {who}: {reason}"
            add_event(session, job, actor=self.actor, kind=EventKind.PREEMPTED,
                      message=f"preempted by {who}: {reason} (attempt {attempt.number};"
                              f" {grace:.0f} s to checkpoint)",
                      data={"by": None if other_team is not None else by, "by_team": other_team,
                            "reason": reason, "attempt": attempt.number, "grace_s": grace})
            return attempt.id, backend, Handle(name=attempt.backend_name, backend_id=attempt.backend_id)

    def _resend_notices(self, backend: Backend, marked: list[tuple[int, Handle]]) -> None:
        """Give notice again, once per dispatcher process, to attempts marked as preempted whose notice this
        process did not send: a dispatcher killed between the mark and `Backend.preempt` (or another
        replica's send) leaves no way to know whether it went out, and a mark without a notice would hold
        the victim's GPUs as "being released" until it ended by itself. Every backend's `preempt` is
        idempotent for a run that already has notice."""
        for attempt_id, handle in marked:
            if attempt_id in self._notice_sent:
                continue
            self._notice_sent.add(attempt_id)
            log.info("giving notice again to %s (marked as preempted; this dispatcher did not send it)",
                     handle.name, extra={"attempt_id": attempt_id})
            with contextlib.suppress(BackendUnavailable, TransientBackendError):
                backend.preempt(handle, self.config.preempt_grace_s)

    @staticmethod
    def _preempted_end(attempt: Attempt, obs: Observation) -> Observation:
        """An attempt this dispatcher preempted ends as `preempted` however its backend words the end (a
        deleted Kubernetes workload reads CANCELLED or MISSING, a program that ignored SIGTERM FAILED)."""
        if attempt.failure != FailureClass.PREEMPTED or attempt.finished_at is not None:
            return obs
        if obs.state not in (RunState.FAILED, RunState.CANCELLED, RunState.MISSING):
            return obs
        why = attempt.exit_reason if not obs.reason else f"{attempt.exit_reason} ({obs.reason})"
        return obs.model_copy(update={"state": RunState.FAILED, "failure": FailureClass.PREEMPTED, "reason": why})

    # -- reconciliation ------------------------------------------------------------------------

    def reconcile(self, report: CycleReport) -> None:
        """One read of every tracked job's current attempt, one `poll` per backend, and writes only for
        the jobs whose observation changes the store (`workers.steady.changes_store`), `APPLY_CHUNK` jobs
        per transaction (`apply_many`). The garbage collector's automatic passes wait until it ends
        (`collector_paused`)."""
        with collector_paused():
            self._reconcile(report)

    def _reconcile(self, report: CycleReport) -> None:
        rows = self._tracked()
        by_backend: dict[str, list[TrackedRow]] = defaultdict(list)
        marked: dict[str, list[tuple[int, Handle]]] = defaultdict(list)
        for row in rows:
            by_backend[row.backend].append(row)
            if row.marked_preempted and row.status != S.CANCELLING:
                marked[row.backend].append((row.attempt_id, row.handle))
        changed: list[tuple[int, int, Observation]] = []
        for backend_name, items in by_backend.items():
            backend = self.backends.get(backend_name)
            if backend is None:
                continue
            for row in items:
                if row.status == S.CANCELLING:
                    with contextlib.suppress(BackendUnavailable, TransientBackendError):  # again next cycle
                        backend.cancel(row.handle)
            self._resend_notices(backend, marked.get(backend_name, []))
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
                if obs is not None and changes_store(row, obs, now=now, missing_grace=MISSING_GRACE,
                                                     pending_memo=self._backend_pending):
                    changed.append((row.job_id, row.number, obs))
        for lo in range(0, len(changed), APPLY_CHUNK):
            report.transitions += self.apply_many(changed[lo:lo + APPLY_CHUNK])

    def _tracked(self) -> list[TrackedRow]:
        """Every tracked job with its current attempt, in one query. Read as Core rows: the attempt's
        `nodes` as JSON text (`TrackedRow.nodes` decodes it when asked), its end and start as whether
        they are recorded, `created_at` without the UTC conversion (`changes_store` applies `as_utc`)."""
        older, same = aliased(Attempt), aliased(Attempt)
        latest = select(func.max(older.number)).where(older.job_id == Job.id).correlate(Job).scalar_subquery()
        runs = (select(func.count(same.id)).where(same.job_id == Job.id, same.backend_id == Attempt.backend_id)
                .correlate(Job, Attempt).scalar_subquery())
        with self.sessions.begin() as session:
            result = session.connection().execute(
                select(Job.id, Job.backend, Job.status, Attempt.number, Attempt.backend_name, Attempt.backend_id,
                       Attempt.id, Attempt.failure, Attempt.finished_at.is_not(None), Attempt.started_at.is_not(None),
                       type_coerce(Attempt.created_at, DateTime(timezone=True)), cast(Attempt.nodes, Text), runs)
                .join(Attempt, Attempt.job_id == Job.id)
                .where(Job.status.in_(TRACKED), Attempt.number == latest)).all()
        return [TrackedRow(job_id=job_id, backend=kind, status=status, number=number,
                           handle=Handle(name=name, backend_id=backend_id), attempt_id=attempt_id, failure=failure,
                           ended=ended, started=started, created_at=created_at, nodes_json=nodes,
                           runs=int(n_runs or 1))
                for (job_id, kind, status, number, name, backend_id, attempt_id, failure, ended, started,
                     created_at, nodes, n_runs) in result]

    def apply(self, job_id: int, number: int, obs: Observation) -> int:
        """Write what the backend observed as transitions of the job and its attempt; return how many."""
        return self.apply_many([(job_id, number, obs)])

    def apply_many(self, observed: list[tuple[int, int, Observation]]) -> int:
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
                changed = self._apply_in_one_transaction(together) if together else 0
                observed = alone
            except Exception:
                log.exception("applying %d observations together failed; applying them one by one", len(together))
        for item in observed:
            try:
                changed += self._apply_in_one_transaction([item])
            except Exception:
                if single:
                    raise
                log.exception("job %d: applying its observation failed", item[0], extra={"job_id": item[0]})
        return changed

    def _apply_in_one_transaction(self, observed: list[tuple[int, int, Observation]]) -> int:
        ids = sorted({job_id for job_id, _, _ in observed})
        remembered = {job_id: self._backend_pending.get(job_id) for job_id in ids}
        try:
            with self.sessions.begin() as session:
                stmt = select(Job).where(Job.id.in_(ids)).order_by(Job.id).options(selectinload(Job.attempts))
                if self._postgres:
                    stmt = stmt.with_for_update(of=Job)
                jobs = {job.id: job for job in session.scalars(stmt)}
                return sum(self._apply_loaded(session, jobs.get(job_id), number, obs)
                           for job_id, number, obs in observed)
        except BaseException:  # nothing was recorded: neither may this dispatcher's memory of it be
            for job_id, value in remembered.items():
                if value is None:
                    self._backend_pending.pop(job_id, None)
                else:
                    self._backend_pending[job_id] = value
            raise

    def _apply_loaded(self, session: Session, job: Job | None, number: int, obs: Observation) -> int:
        """`apply` on a job read (and locked) in `session`."""
        if job is None or job.status not in TRACKED or not job.attempts or job.attempts[-1].number != number:
            return 0
        job_id = job.id
        attempt = job.attempts[-1]
        status = job.status
        attempt = self._record_requeues(session, job, attempt, obs)
        if obs.state == RunState.RUNNING and attempt.started_at is None:  # usage counts from here
            attempt.started_at = utcnow()
        obs = self._preempted_end(attempt, obs)
        if obs.state == RunState.PENDING and status == S.PENDING:
            self._note_backend_pending(session, job, attempt, obs)
        if obs.nodes and attempt.nodes != obs.nodes:
            attempt.nodes = obs.nodes
        if obs.state == RunState.RUNNING and status == S.PENDING:
            attempt.status = AttemptStatus.RUNNING
            transition(session, job, S.RUNNING, actor=self.actor, message=f"running on {', '.join(obs.nodes)}",
                       data={"nodes": obs.nodes})
        elif obs.state == RunState.SUCCEEDED:
            self._finish(attempt, obs)
            transition(session, job, S.SUCCEEDED, actor=self.actor, message="finished",
                       data={"exit_code": obs.exit_code})
        elif obs.state == RunState.CANCELLED:
            self._finish(attempt, obs)
            if status != S.CANCELLING:
                transition(session, job, S.CANCELLING, actor=self.actor, message="cancelled on the backend")
            transition(session, job, S.CANCELLED, actor=self.actor, message="cancelled on the backend too")
        elif obs.state == RunState.FAILED:
            self._finish(attempt, obs)
            self._failed(session, job, status, obs)
        elif obs.state == RunState.MISSING and status == S.CANCELLING:
            self._finish(attempt, obs.model_copy(update={"failure": FailureClass.CANCELLED}))
            transition(session, job, S.CANCELLED, actor=self.actor, message="gone from the backend after cancel")
        elif obs.state == RunState.MISSING and utcnow() - as_utc(attempt.created_at) > MISSING_GRACE:
            obs = obs.model_copy(update={"failure": FailureClass.LOST,
                                         "reason": "the backend no longer knows this submission"})
            self._finish(attempt, obs)
            self._failed(session, job, status, obs)
        if job.status != S.PENDING:
            self._backend_pending.pop(job_id, None)
        return int(job.status != status)

    def _note_backend_pending(self, session: Session, job: Job, attempt: Attempt, obs: Observation) -> None:
        """Append `job.backend_pending` (data: reason, expected_start, attempt) when the backend's own
        reason for holding this attempt, or its start estimate rounded to `ESTIMATE_STEP_S`, differs
        from the last one recorded for the attempt; nothing when unchanged, so a job that waits for
        hours writes once per change, not once per cycle. The last value is remembered per job in
        this dispatcher's memory; the store's last event (one indexed read) decides whenever memory has
        none or disagrees: after a restart, or when another replica recorded it. A first observation
        without reason or estimate records nothing."""
        key = change_key(obs.pending_reason, obs.expected_start)
        if self._backend_pending.get(job.id) == (attempt.number, key):
            return
        last = last_backend_pending(session, job.id, attempt.number)
        if (last.key if last is not None else (None, None)) != key:
            when = (f"; expected to start at {datetime.fromtimestamp(obs.expected_start, UTC):%Y-%m-%dT%H:%M:%SZ}"
                    if obs.expected_start is not None else "; no start estimate")
            add_event(session, job, actor=self.actor, kind=EventKind.BACKEND_PENDING,
                      message=f"{job.backend} holds attempt {attempt.number}: {obs.pending_reason or 'no reason given'}"
                              + when,
                      data={"reason": obs.pending_reason, "expected_start": obs.expected_start,
                            "attempt": attempt.number})
        self._backend_pending[job.id] = (attempt.number, key)

    def _record_requeues(self, session: Session, job: Job, attempt: Attempt, obs: Observation) -> Attempt:
        """A backend that requeued the same submission (Slurm's own preemption) reports `requeues`; each
        one not yet recorded closes the current attempt with its reason and opens the next, which keeps
        the backend's name and id. Returns the attempt that is current now.

        An attempt this dispatcher marked as preempted (`preempt`) that the backend requeued anyway (a
        Slurm preemption racing ours, or a requeue sent before `Backend.preempt` stopped requeueing) hands
        its mark to the requeued run: that run is then given notice (`_resend_notices`) and its end returns
        the job to the queue without its admission, instead of running on by itself while the job keeps its
        pool and is chosen as a victim again and again."""
        if not attempt.backend_id:
            return attempt
        runs = [a for a in job.attempts if a.backend_id == attempt.backend_id]
        while obs.requeues > len(runs) - 1:
            index = len(runs) - 1
            why = obs.requeue_reasons[index] if index < len(obs.requeue_reasons) else "requeued by the backend"
            marked = attempt.exit_reason if attempt.failure == FailureClass.PREEMPTED else None
            attempt.status, attempt.exit_reason, attempt.finished_at = (
                AttemptStatus.PREEMPTED, f"{marked}; requeued: {why}" if marked else f"requeued: {why}", utcnow())
            attempt.failure = FailureClass.PREEMPTED
            nxt = Attempt(job_id=job.id, number=attempt.number + 1, backend_name=attempt.backend_name,
                          backend_id=attempt.backend_id, status=AttemptStatus.PENDING, nodes=[],
                          failure=FailureClass.PREEMPTED if marked else None, exit_reason=marked)
            session.add(nxt)
            job.attempts.append(nxt)
            add_event(session, job, actor=self.actor, kind=EventKind.REQUEUED,
                      message=f"attempt {attempt.number} {why}; the backend requeued it as attempt {nxt.number}",
                      data={"attempt": nxt.number, "reason": why})
            if why.startswith("preempted"):  # the scheduler's own preemption (e.g. a higher PriorityTier partition)
                add_event(session, job, actor=self.actor, kind=EventKind.PREEMPTED,
                          message=f"preempted by {job.backend}'s scheduler: {why}",
                          data={"by": None, "by_backend": job.backend, "reason": why, "attempt": attempt.number})
            runs.append(nxt)
            attempt = nxt
        return attempt

    def _finish(self, attempt: Attempt, obs: Observation) -> None:
        """Close the attempt with the backend's evidence: the failure class (None when it succeeded),
        the program's own exit code, the reason and the program's last lines."""
        attempt.status = AttemptStatus(obs.state.value)
        attempt.exit_code = obs.exit_code
        attempt.exit_reason = obs.reason
        attempt.failure = obs.failure if obs.state != RunState.SUCCEEDED else None
        attempt.log_tail = obs.log_tail
        attempt.finished_at = utcnow()
        if attempt.started_at is None and obs.exit_code is not None:
            # it ran and ended between two polls: its GPUs were held since it was handed over (an upper
            # bound; without it the run would count as no usage at all in fair share)
            attempt.started_at = attempt.created_at

    def _failed(self, session: Session, job: Job, status: JobStatus, obs: Observation) -> None:
        data = {"exit_code": obs.exit_code, "failure": obs.failure.value if obs.failure else None,
                "reason": obs.reason, "log_tail": obs.log_tail}
        if status == S.CANCELLING:
            transition(session, job, S.CANCELLED, actor=self.actor, message=f"stopped: {obs.reason}", data=data)
            return
        if obs.failure == FailureClass.PREEMPTED:  # back at once, in its place; not counted against max_attempts
            transition(session, job, S.QUEUED, actor=self.actor,
                       message=f"{obs.reason or 'preempted'}; queued again (a preemption is not counted"
                               f" against max_attempts)", data=data)
            job.lease_owner = job.lease_expires_at = None
            return
        if obs.failure in OUT_OF_MEMORY and self._replan_after_oom(session, job, obs, data):
            return
        counted = counted_attempts(job)
        if obs.failure is not None and obs.failure.retried and counted < self.config.max_attempts:
            backoff = self.config.retry_backoff_s * 2 ** (counted - 1)
            transition(session, job, S.QUEUED, actor=self.actor,
                       message=f"retrying after {obs.failure}: {obs.reason} (attempt {counted}"
                               f" of {self.config.max_attempts}, in {backoff:.0f} s)", data=data)
            job.lease_owner = None
            job.lease_expires_at = utcnow() + timedelta(seconds=backoff)
            return
        transition(session, job, S.FAILED, actor=self.actor,
                   message=f"{obs.failure or 'failed'}: {obs.reason or ''}".strip(), data=data)


    def _replan_after_oom(self, session: Session, job: Job, obs: Observation, data: dict[str, Any]) -> bool:
        """After an attempt ran out of memory: when the spec's `recovery.replan_on_oom` is on and fewer than
        `recovery.max_replans` re-plans were made, plan the job again under the memory the attempt measured
        (`service.planner.replan.next_plan`, from the peak in its log tail), store that plan as the job's
        plan (the next attempt runs it), append `job.replanned` naming the old and new layouts and the
        measured peak, and queue the job again at once; return True. Otherwise append `job.replan_refused`
        with the reason (when recovery is on) and return False: the job fails as before.

        Called inside the transaction that closes the attempt, so the decision and the requeue commit
        together: a dispatcher that dies before the commit leaves the attempt open, and the next poll makes
        the same decision from the same inputs (the planner is deterministic); one that dies after it
        finds the job QUEUED with its new plan. A re-plan counts against `max_replans`, never against
        `max_attempts` (`counted_attempts` leaves out-of-memory attempts out)."""
        recovery = job.spec.recovery
        if not recovery.replan_on_oom or obs.failure is None:
            return False
        attempt = job.attempts[-1]
        done = sum(1 for a in job.attempts[:-1] if a.failure in OUT_OF_MEMORY)
        measured = measured_oom(obs.log_tail or "")
        peak = measured.peak_bytes if measured is not None else None
        failed = job.plan
        facts = {"attempt": attempt.number, "failure": obs.failure.value, "measured_peak_bytes": peak,
                 "limit_bytes": measured.limit_bytes if measured is not None else None,
                 "replans": done, "max_replans": recovery.max_replans, "layout": failed.layout.to_dict()}
        result: replan.Replan | replan.NoReplan | None = None
        if done < recovery.max_replans:
            result = replan.next_plan(job.spec, failed, obs.failure, measured)
        if not isinstance(result, replan.Replan):
            why = (result.reason if result is not None else
                   f"recovery.max_replans ({recovery.max_replans}) re-plans made already")
            add_event(session, job, actor=self.actor, kind=EventKind.REPLAN_REFUSED,
                      message=f"attempt {attempt.number} ran out of memory ({obs.failure}); not planned again: {why}",
                      data={**facts, "reason": why})
            return False
        new, cap = result.plan, result.cap
        job.plan = new
        job.layout = new.layout.short()[:200]
        job.predicted_step_s = new.time.step_s
        job.predicted_s = new.time.step_s * new.training.steps if new.training is not None else None
        measured_words = f"measured peak {peak:,} bytes" if peak is not None else "no peak measured"
        add_event(session, job, actor=self.actor, kind=EventKind.REPLANNED,
                  message=f"attempt {attempt.number} ran out of memory ({obs.failure}, {measured_words}, predicted"
                          f" {cap.predicted_bytes:,}); re-planned {failed.layout.short()} -> {new.layout.short()}"
                          f" ({result.rung} rung, re-plan {done + 1} of {recovery.max_replans})",
                  data={**facts, "rung": result.rung, "old_layout": failed.layout.to_dict(),
                        "new_layout": new.layout.to_dict(), "old": failed.layout.short(), "new": new.layout.short(),
                        "predicted_bytes": cap.predicted_bytes,
                        "new_predicted_bytes": replan.predicted_allocated(new), "cap_bytes": cap.cap_bytes,
                        "scale": cap.scale, "replan": done + 1, "next_attempt": attempt.number + 1})
        transition(session, job, S.QUEUED, actor=self.actor,
                   message=f"{obs.failure}: {obs.reason or ''}; queued again with {new.layout.short()} (re-plan"
                           f" {done + 1} of {recovery.max_replans}, not counted against max_attempts)", data=data)
        job.lease_owner = job.lease_expires_at = None
        log.info("job %d re-planned after %s: %s -> %s", job.id, obs.failure, failed.layout.short(),
                 new.layout.short(), extra={"job_id": job.id, "decision": "replanned", "rung": result.rung})
        return True


def being_preempted(session: Session) -> set[int]:
    """Ids of the jobs whose current attempt has been told to stop (`Dispatcher.preempt`) and has not ended
    yet: admission must not choose them as victims again."""
    return set(session.scalars(select(Attempt.job_id).where(Attempt.failure == FailureClass.PREEMPTED,
                                                            Attempt.finished_at.is_(None))))


def counted_attempts(job: Job) -> int:
    """The attempts that count against `max_attempts`: every one but those that ended preempted or out of
    memory (an out-of-memory attempt either fails the job or counts against `recovery.max_replans`)."""
    return sum(1 for a in job.attempts if a.failure != FailureClass.PREEMPTED and a.failure not in OUT_OF_MEMORY)
