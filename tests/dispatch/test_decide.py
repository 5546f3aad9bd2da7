"""`service.lifecycle_decide.decide`: what an observation changes, as users see it, and its agreement with
what the dispatcher writes (the reconcile cycle skips the jobs whose answer is `NO_CHANGE`)."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, select

from service.failures import FailureClass
from service.lifecycle_decide import NO_CHANGE, AttemptFacts, JobFacts, RetryPolicy, decide
from service.observation import Observation, RunState
from service.store.db import make_engine, make_sessionmaker
from service.store.models import Attempt, Event, Job
from service.store.vocab import AttemptStatus, EventKind, JobStatus
from tests.db_fixtures import Env
from tests.specs import tiny
from workers.dispatch import reconcile
from workers.dispatch.context import DispatcherConfig
from workers.dispatcher import Dispatcher

S = JobStatus
NOW = datetime(2026, 12, 10, 12, 0, tzinfo=UTC)
POLICY = RetryPolicy(max_attempts=3, backoff_s=5.0, missing_grace=timedelta(seconds=60))


def running(**changed: Any) -> AttemptFacts:
    facts: dict[str, Any] = {"number": 1, "backend_id": "101", "runs": 1, "failure": None, "exit_reason": None,
                             "ended": False, "started": True, "created_at": NOW - timedelta(hours=1),
                             "nodes": ["n1"]}
    return AttemptFacts(**(facts | changed))


def job(status: JobStatus = S.RUNNING, counted: int = 0) -> JobFacts:
    return JobFacts(status=status, backend="slurm", counted=counted)


def failed(failure: FailureClass, **extra: Any) -> Observation:
    return Observation(state=RunState.FAILED, exit_code=1, failure=failure, reason="it broke", **extra)


def test_a_failed_attempt_with_retries_left_is_queued_again_after_its_back_off() -> None:
    changes = decide(job(counted=1), running(number=2), failed(FailureClass.NODE_FAILURE), now=NOW, policy=POLICY)
    assert changes.status == S.QUEUED
    assert changes.not_before == NOW + timedelta(seconds=5.0 * 2)  # the second counted attempt: 5 s x 2
    assert changes.end is not None and changes.end.status == AttemptStatus.FAILED
    assert changes.end.failure == FailureClass.NODE_FAILURE and changes.end.finished_at == NOW
    assert "attempt 2 of 3" in changes.moves[-1].message and not changes.replan


def test_a_failure_with_no_attempts_left_or_not_retried_fails_the_job() -> None:
    spent = decide(job(counted=2), running(number=3), failed(FailureClass.NODE_FAILURE), now=NOW, policy=POLICY)
    program = decide(job(), running(), failed(FailureClass.PROGRAM_ERROR), now=NOW, policy=POLICY)
    for changes in (spent, program):
        assert changes.status == S.FAILED and changes.not_before is None
        assert changes.moves[-1].data is not None and changes.moves[-1].data["reason"] == "it broke"


def test_a_preemption_is_queued_again_at_once_and_not_counted() -> None:
    changes = decide(job(counted=2), running(number=3), failed(FailureClass.PREEMPTED), now=NOW, policy=POLICY)
    assert changes.status == S.QUEUED and changes.not_before is None


def test_an_attempt_marked_as_preempted_ends_preempted_however_the_backend_words_it() -> None:
    marked = running(failure=FailureClass.PREEMPTED, exit_reason="preempted by job 7: reclaim")
    for obs in (Observation(state=RunState.CANCELLED), Observation(state=RunState.MISSING), failed(FailureClass.LOST)):
        changes = decide(job(), marked, obs, now=NOW, policy=POLICY)
        assert changes.end is not None and changes.end.failure == FailureClass.PREEMPTED
        assert changes.end.reason is not None and changes.end.reason.startswith("preempted by job 7: reclaim")
        assert changes.status == S.QUEUED and changes.not_before is None


def test_a_cancelled_job_s_attempt_ends_cancelled() -> None:
    gone = decide(job(S.CANCELLING), running(), Observation(state=RunState.MISSING), now=NOW, policy=POLICY)
    assert gone.end is not None and gone.end.failure == FailureClass.CANCELLED and gone.status == S.CANCELLED
    stopped = decide(job(S.CANCELLING), running(), failed(FailureClass.NODE_FAILURE), now=NOW, policy=POLICY)
    assert stopped.status == S.CANCELLED and stopped.not_before is None  # never retried
    on_backend = decide(job(S.RUNNING), running(), Observation(state=RunState.CANCELLED), now=NOW, policy=POLICY)
    assert [m.status for m in on_backend.moves] == [S.CANCELLING, S.CANCELLED]
    assert on_backend.end is not None and on_backend.end.status == AttemptStatus.CANCELLED


def test_an_out_of_memory_end_fails_unless_a_re_plan_queues_it() -> None:
    changes = decide(job(), running(), failed(FailureClass.OOM_GPU), now=NOW, policy=POLICY)
    assert changes.status == S.FAILED and changes.replan


def test_a_run_the_backend_forgot_is_lost_only_after_the_grace() -> None:
    missing = Observation(state=RunState.MISSING)
    young = running(created_at=NOW - timedelta(seconds=30), started=False)
    assert decide(job(S.PENDING), young, missing, now=NOW, policy=POLICY) is NO_CHANGE
    lost = decide(job(S.PENDING), running(started=False), missing, now=NOW, policy=POLICY)
    assert lost.end is not None and lost.end.failure == FailureClass.LOST and lost.status == S.QUEUED
    assert lost.not_before == NOW + timedelta(seconds=5)


def test_running_starts_the_attempt_once_and_success_ends_it() -> None:
    first = decide(job(S.PENDING), running(started=False, nodes=[]), Observation(state=RunState.RUNNING, nodes=["n1"]),
                   now=NOW, policy=POLICY)
    assert first.started_at == NOW and first.running and first.nodes == ["n1"] and first.status == S.RUNNING
    steady = Observation(state=RunState.RUNNING, nodes=["n1"])
    assert decide(job(), running(), steady, now=NOW, policy=POLICY) is NO_CHANGE
    done = decide(job(), running(), Observation(state=RunState.SUCCEEDED, exit_code=0), now=NOW, policy=POLICY)
    assert done.status == S.SUCCEEDED and done.end is not None and done.end.failure is None
    quick = decide(job(S.PENDING), running(started=False), Observation(state=RunState.SUCCEEDED, exit_code=0),
                   now=NOW, policy=POLICY)
    assert quick.end is not None and quick.end.started_at_creation  # ran between two polls


def test_a_backend_requeue_opens_the_next_attempt_and_says_why() -> None:
    obs = Observation(state=RunState.PENDING, requeues=1, requeue_reasons=["preempted by partition urgent"])
    changes = decide(job(), running(), obs, now=NOW, policy=POLICY)
    assert [r.reason for r in changes.requeues] == ["preempted by partition urgent"]
    assert [n.kind for n in changes.events] == [EventKind.REQUEUED, EventKind.PREEMPTED]
    assert changes.status is None  # the job stays RUNNING while the backend holds the requeued run


def test_the_backend_s_reason_for_holding_a_job_is_noted_once() -> None:
    obs = Observation(state=RunState.PENDING, pending_reason="Resources")
    first = decide(job(S.PENDING), running(started=False), obs, now=NOW, policy=POLICY)
    assert first.pending is not None and first.pending_key == ("Resources", None)
    again = decide(job(S.PENDING), running(started=False, pending_key=("Resources", None)), obs, now=NOW,
                   policy=POLICY)
    assert again is NO_CHANGE


def test_a_job_that_is_not_tracked_changes_nothing() -> None:
    for status in (S.QUEUED, S.SUBMITTING, S.SUCCEEDED, S.FAILED, S.CANCELLED):
        assert decide(job(status), running(), failed(FailureClass.NODE_FAILURE), now=NOW, policy=POLICY) is NO_CHANGE


OBSERVATIONS = [
    Observation(state=RunState.PENDING),
    Observation(state=RunState.PENDING, pending_reason="Resources", expected_start=NOW.timestamp() + 600),
    Observation(state=RunState.PENDING, requeues=1, requeue_reasons=["preempted by partition urgent"]),
    Observation(state=RunState.RUNNING),
    Observation(state=RunState.RUNNING, nodes=["n1"]),
    Observation(state=RunState.RUNNING, nodes=["n2"]),
    Observation(state=RunState.SUCCEEDED, exit_code=0),
    Observation(state=RunState.FAILED, exit_code=1, failure=FailureClass.NODE_FAILURE, reason="node down"),
    Observation(state=RunState.FAILED, exit_code=1, failure=FailureClass.PROGRAM_ERROR, reason="bug"),
    Observation(state=RunState.CANCELLED),
    Observation(state=RunState.MISSING),
]
#: (started, nodes, preemption mark, age): a steady attempt, a young one never seen running, one being preempted
ATTEMPTS = [(True, ["n1"], False, timedelta(hours=1)), (False, [], False, timedelta(seconds=5)),
            (True, ["n1"], True, timedelta(seconds=5))]


def _stored(sessions: Any, job_id: int) -> tuple[Any, ...]:
    with sessions.begin() as session:
        row = session.get(Job, job_id)
        assert row is not None
        columns = tuple(getattr(row, c.key) for c in Job.__table__.columns if c.key not in ("spec", "plan"))
        attempts = tuple(tuple(getattr(a, c.key) for c in Attempt.__table__.columns) for a in row.attempts)
        events = session.scalar(select(func.count(Event.id)).where(Event.job_id == job_id))
        return columns, attempts, events


def test_no_change_from_decide_is_exactly_no_write_by_the_dispatcher(env: Env, admin: dict[str, str]) -> None:
    """For every tracked status, kinds of attempt and observation kind: the reconcile cycle's read of the job
    decides `NO_CHANGE` exactly when applying the observation under the row lock writes nothing."""
    sessions = make_sessionmaker(make_engine(env.url))
    dispatcher = Dispatcher(sessions, {}, DispatcherConfig(owner="agreement"))
    cases = list(itertools.product([S.PENDING, S.RUNNING, S.CANCELLING], ATTEMPTS, OBSERVATIONS))
    ids = [env.client.post("/v1/jobs", json=tiny(), headers=admin).json()["id"] for _ in cases]
    with sessions.begin() as session:
        for job_id, (status, (started, nodes, marked, age), _) in zip(ids, cases, strict=True):
            created = datetime.now(UTC) - age
            session.add(Attempt(job_id=job_id, number=1, backend_name=f"shardctl-{job_id}-1", backend_id=str(job_id),
                                status=AttemptStatus.RUNNING, nodes=nodes, created_at=created,
                                started_at=created if started else None,
                                failure=FailureClass.PREEMPTED if marked else None,
                                exit_reason="preempted by job 1: reclaim" if marked else None))
            row = session.get(Job, job_id)
            assert row is not None
            row.status = status
    for job_id in ids:  # what this dispatcher knows already: no backend reason recorded for them
        dispatcher.backend_pending[job_id] = (1, (None, None))
    tracked = {row.job_id: row for row in reconcile._tracked(dispatcher)}
    kinds: set[tuple[bool, bool]] = set()
    for job_id, (_, _, obs) in zip(ids, cases, strict=True):
        row = tracked[job_id]
        skipped = decide(row.job, row.attempt, obs, now=datetime.now(UTC), policy=dispatcher.policy) is NO_CHANGE
        before = _stored(sessions, job_id)
        dispatcher.apply(job_id, 1, obs)
        wrote = _stored(sessions, job_id) != before
        assert skipped != wrote, (row, obs)
        kinds.add((skipped, wrote))
    assert kinds == {(True, False), (False, True)}  # both answers were seen
