"""What a backend's observation of a job's current attempt changes in the store: `decide`, the one copy
of the reconcile rules. The dispatcher applies its answer under the job's row lock
(`workers.dispatch.reconcile`), and its reconcile cycle opens no transaction for a job whose answer is
`NO_CHANGE`; both read the rules here, so they cannot part.

Pure: plain values in, plain values out; no store, no I/O, no clock (`now` is given).

The rules, in the order they apply:

1. Requeues the backend made of the same submission (Slurm's own preemption) and not yet recorded each
   close the current attempt as PREEMPTED and open the next under the same backend name and id
   (`job.requeued`, and `job.preempted` when the backend says it preempted it). An attempt marked as
   being preempted hands its mark to the attempt that continues it.
2. RUNNING stamps the attempt's start once. An attempt marked as being preempted that ends in any way
   (FAILED, CANCELLED, MISSING) ended `preempted`.
3. PENDING on a PENDING job notes the backend's own reason and start estimate when they differ from
   the last ones recorded for the attempt (`job.backend_pending`).
4. Nodes the backend names are recorded when they differ.
5. The job moves: PENDING -> RUNNING; an end closes the attempt with its evidence and moves the job to
   SUCCEEDED, CANCELLED (through CANCELLING), QUEUED (a preemption at once, a retried failure class
   after a back-off, while `max_attempts` allows) or FAILED; a CANCELLING job whose attempt ended, or
   whose attempt the backend no longer knows, is CANCELLED. An attempt the backend has not known for
   longer than `missing_grace` ended `lost`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from service.failures import OUT_OF_MEMORY, FailureClass
from service.lifecycle import TRACKED
from service.observation import Observation, RunState
from service.store.backend_pending import ChangeKey, change_key
from service.store.models import as_utc
from service.store.vocab import AttemptStatus, EventKind, JobStatus

S = JobStatus
_ENDS = frozenset({RunState.FAILED, RunState.CANCELLED, RunState.MISSING})
_RUNNING, _PENDING = RunState.RUNNING, RunState.PENDING
#: failure classes whose attempts do not count against `max_attempts`
NOT_COUNTED: frozenset[FailureClass] = frozenset({FailureClass.PREEMPTED, *OUT_OF_MEMORY})


@dataclass(frozen=True, slots=True)
class JobFacts:
    """The job, as `decide` reads it. `counted`: its attempts before the current one that count against
    `max_attempts` (`counts_against_max_attempts`)."""

    status: JobStatus
    backend: str
    counted: int


@dataclass(frozen=True, slots=True)
class AttemptFacts:
    """The job's current attempt. `runs`: the job's attempts that share its backend id, itself included
    (a backend requeue opens one under the same id). `failure`/`exit_reason`: as recorded; on an attempt
    not `ended`, failure `preempted` is the mark of a preemption under way. `created_at`: UTC, aware or
    naive. `nodes`: as recorded (None: never). `pending_key`: the backend's reason and estimate last
    recorded for this attempt, as far as the caller knows (None: it does not know)."""

    number: int
    backend_id: str | None
    runs: int
    failure: FailureClass | None
    exit_reason: str | None
    ended: bool
    started: bool
    created_at: datetime
    nodes: list[str] | None
    pending_key: ChangeKey | None = None


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How many counted attempts a job gets, the back-off before the n-th retry (`backoff_s * 2**(n-1)`)
    and how long an attempt the backend does not know may stay unknown before it counts as lost."""

    max_attempts: int
    backoff_s: float
    missing_grace: timedelta


@dataclass(frozen=True, slots=True)
class Note:
    """An event to append: its kind, message and data."""

    kind: str
    message: str
    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Requeue:
    """One backend requeue to record: the current attempt closes as PREEMPTED at `finished_at` with
    `reason` and the next opens under the same backend name and id, carrying the preemption mark `marked`
    when there is one."""

    reason: str
    marked: str | None
    finished_at: datetime


@dataclass(frozen=True, slots=True)
class AttemptEnd:
    """How the current attempt closed: its status, failure class (None when it succeeded), the program's
    exit code, the reason and last lines; `started_at_creation`: it ran with no start recorded (it started
    and ended between two polls), so its start is its creation."""

    status: AttemptStatus
    failure: FailureClass | None
    exit_code: int | None
    reason: str | None
    log_tail: str | None
    finished_at: datetime
    started_at_creation: bool


@dataclass(frozen=True, slots=True)
class Move:
    """A status transition of the job, with its event's message and data."""

    status: JobStatus
    message: str
    data: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Changes:
    """What to write, in this order: `requeues` (with their `events`); the current attempt's
    `started_at`; the `pending` note, written unless the store's last one for this attempt has the same
    `pending_key`; `nodes`; `running` (the attempt's status becomes RUNNING); `end`; the job's `moves`.
    A job whose last move is to QUEUED gives its lease up and is not leased before `not_before` (None:
    at once). `replan`: an out-of-memory end; the moves fail the job unless its spec's recovery plans it
    again, which queues it at once instead. `NO_CHANGE` (every field empty) writes nothing."""

    requeues: tuple[Requeue, ...] = ()
    events: tuple[Note, ...] = ()
    started_at: datetime | None = None
    pending: Note | None = None
    pending_key: ChangeKey | None = None
    nodes: list[str] | None = None
    running: bool = False
    end: AttemptEnd | None = None
    moves: tuple[Move, ...] = ()
    not_before: datetime | None = None
    replan: bool = False

    @property
    def status(self) -> JobStatus | None:
        """The job's status after the moves; None when it stays."""
        return self.moves[-1].status if self.moves else None


NO_CHANGE = Changes()


def counts_against_max_attempts(failure: FailureClass | None) -> bool:
    """Whether an attempt with this failure class counts against `max_attempts`: every one but those that
    ended preempted or out of memory (an out-of-memory attempt fails the job or counts against
    `recovery.max_replans`)."""
    return failure not in NOT_COUNTED


def decide(job: JobFacts, attempt: AttemptFacts, obs: Observation, *, now: datetime,
           policy: RetryPolicy) -> Changes:
    """What `obs`, the backend's observation of `attempt`, changes for `job` at `now` (the module's rules).
    `NO_CHANGE` when nothing, and always for a job that is not tracked (PENDING, RUNNING, CANCELLING)."""
    status = job.status
    if status not in TRACKED:
        return NO_CHANGE
    state = obs.state
    number, failure, mark = attempt.number, attempt.failure, attempt.exit_reason
    ended, started, fresh = attempt.ended, attempt.started, False
    requeues: tuple[Requeue, ...] = ()
    events: tuple[Note, ...] = ()
    if obs.requeues >= attempt.runs and attempt.backend_id:
        marked = mark if failure == FailureClass.PREEMPTED else None
        reasons = obs.requeue_reasons
        whys = [reasons[i] if i < len(reasons) else "requeued by the backend"
                for i in range(attempt.runs - 1, obs.requeues)]
        requeues = tuple(Requeue(why, marked, now) for why in whys)
        events = tuple(_requeue_events(job.backend, number, whys))
        number += len(whys)
        failure, mark, ended, started, fresh = (FailureClass.PREEMPTED if marked else None, marked, False,
                                                False, True)
    failure_seen, reason = obs.failure, obs.reason
    started_at = now if state == _RUNNING and not started else None
    if failure == FailureClass.PREEMPTED and not ended and state in _ENDS:
        state, failure_seen = RunState.FAILED, FailureClass.PREEMPTED
        reason = mark if not reason else f"{mark} ({reason})"
    pending, pending_key = None, None
    if state == _PENDING and status == S.PENDING:
        key = change_key(obs.pending_reason, obs.expected_start)
        if attempt.pending_key != key or fresh:
            pending, pending_key = _pending_note(job.backend, number, obs), key
    nodes = obs.nodes if obs.nodes and obs.nodes != ((attempt.nodes or []) if not fresh else []) else None
    running, end, not_before, replan = False, None, None, False
    moves: tuple[Move, ...] = ()
    if state == _RUNNING:
        if status == S.PENDING:
            running = True
            moves = (Move(S.RUNNING, f"running on {', '.join(obs.nodes)}", {"nodes": obs.nodes}),)
    elif state == _PENDING:
        pass
    elif state == RunState.SUCCEEDED:
        end = _end(state, None, reason, obs, now, started)
        moves = (Move(S.SUCCEEDED, "finished", {"exit_code": obs.exit_code}),)
    elif state == RunState.CANCELLED:
        end = _end(state, failure_seen, reason, obs, now, started)
        moves = (*(() if status == S.CANCELLING else (Move(S.CANCELLING, "cancelled on the backend"),)),
                 Move(S.CANCELLED, "cancelled on the backend too"))
    elif state == RunState.MISSING and status == S.CANCELLING:
        end = _end(state, FailureClass.CANCELLED, reason, obs, now, started)
        moves = (Move(S.CANCELLED, "gone from the backend after cancel"),)
    elif state == RunState.FAILED or (state == RunState.MISSING and not fresh
                                      and now - as_utc(attempt.created_at) > policy.missing_grace):
        if state == RunState.MISSING:
            failure_seen, reason = FailureClass.LOST, "the backend no longer knows this submission"
        end = _end(state, failure_seen, reason, obs, now, started)
        counted = job.counted + counts_against_max_attempts(failure_seen)
        moves, not_before = _after_failure(status, failure_seen, reason, obs, counted, policy, now)
        replan = status != S.CANCELLING and failure_seen in OUT_OF_MEMORY
    if not (requeues or started_at or pending or nodes or moves):
        return NO_CHANGE
    return Changes(requeues=requeues, events=events, started_at=started_at, pending=pending, pending_key=pending_key,
                   nodes=nodes, running=running, end=end, moves=moves, not_before=not_before, replan=replan)


def _requeue_events(backend: str, number: int, whys: list[str]) -> list[Note]:
    notes = []
    for closed, why in enumerate(whys, start=number):
        notes.append(Note(EventKind.REQUEUED,
                          f"attempt {closed} {why}; the backend requeued it as attempt {closed + 1}",
                          {"attempt": closed + 1, "reason": why}))
        if why.startswith("preempted"):  # the scheduler's own preemption (e.g. a higher PriorityTier partition)
            notes.append(Note(EventKind.PREEMPTED, f"preempted by {backend}'s scheduler: {why}",
                              {"by": None, "by_backend": backend, "reason": why, "attempt": closed}))
    return notes


def _pending_note(backend: str, number: int, obs: Observation) -> Note:
    when = ("; no start estimate" if obs.expected_start is None else
            f"; expected to start at {datetime.fromtimestamp(obs.expected_start, UTC):%Y-%m-%dT%H:%M:%SZ}")
    return Note(EventKind.BACKEND_PENDING,
                f"{backend} holds attempt {number}: {obs.pending_reason or 'no reason given'}{when}",
                {"reason": obs.pending_reason, "expected_start": obs.expected_start, "attempt": number})


def _end(state: RunState, failure: FailureClass | None, reason: str | None, obs: Observation, now: datetime,
         started: bool) -> AttemptEnd:
    return AttemptEnd(status=AttemptStatus(state.value), failure=failure, exit_code=obs.exit_code, reason=reason,
                      log_tail=obs.log_tail, finished_at=now,
                      started_at_creation=not started and obs.exit_code is not None)


def _after_failure(status: JobStatus, failure: FailureClass | None, reason: str | None, obs: Observation,
                   counted: int, policy: RetryPolicy, now: datetime) -> tuple[tuple[Move, ...], datetime | None]:
    """The moves after a failed end, and the back-off's end when it is a retry."""
    data = {"exit_code": obs.exit_code, "failure": failure.value if failure else None, "reason": reason,
            "log_tail": obs.log_tail}
    if status == S.CANCELLING:
        return (Move(S.CANCELLED, f"stopped: {reason}", data),), None
    if failure == FailureClass.PREEMPTED:  # back at once, in its place; not counted against max_attempts
        return (Move(S.QUEUED, f"{reason or 'preempted'}; queued again (a preemption is not counted against"
                               f" max_attempts)", data),), None
    if failure is not None and failure.retried and counted < policy.max_attempts:
        backoff = policy.backoff_s * 2 ** (counted - 1)
        return (Move(S.QUEUED, f"retrying after {failure}: {reason} (attempt {counted} of {policy.max_attempts},"
                               f" in {backoff:.0f} s)", data),), now + timedelta(seconds=backoff)
    return (Move(S.FAILED, f"{failure or 'failed'}: {reason or ''}".strip(), data),), None
