"""The submit phase, in three steps, each safe to crash after: one transaction writes SUBMITTING, the
attempt row (its name `shardctl-<job id>-<n>` is deterministic) and a fresh job token; then, outside any
transaction, the backend is asked for that name (`find`) and the run adopted when it exists, else
submitted; then one transaction writes PENDING with the backend's id. A crash between two steps leaves a
SUBMITTING job whose lease expires; the next dispatcher finds the name and adopts it, so nothing is
submitted twice."""

from __future__ import annotations

import logging
from datetime import timedelta

from service.lifecycle import UNSUBMITTED
from service.redaction import redact_strings
from service.store.models import Attempt, Job, utcnow
from service.store.pools import kueue_queue_for
from service.store.states import add_event, transition
from service.store.tokens import create_token
from service.store.vocab import AttemptStatus, EventKind, FailureClass, JobStatus, Role
from workers.backends.base import BackendUnavailable, SubmissionRefused, TransientBackendError, attempt_name
from workers.dispatch.context import Context, CycleReport, failpoint
from workers.dispatch.request import build_request

log = logging.getLogger("shardctl.dispatcher")
S = JobStatus


def submit_one(ctx: Context, job_id: int, report: CycleReport) -> None:
    """SUBMITTING and the attempt row, committed; then find-or-submit outside any transaction;
    then PENDING with the backend's id."""
    with ctx.sessions.begin() as session:
        job = ctx.owned(session, job_id)
        if job is None or job.status not in UNSUBMITTED:
            return
        backend = ctx.backends.get(job.backend)
        if backend is None:  # the API checks at submit; the configuration changed since
            if job.status == S.QUEUED:
                transition(session, job, S.SUBMITTING, actor=ctx.actor)
            transition(session, job, S.FAILED, actor=ctx.actor,
                       message=f"backend {job.backend!r} is not configured on this dispatcher",
                       data={"configured": sorted(ctx.backends)})
            job.lease_owner = job.lease_expires_at = None
            return
        if job.status == S.QUEUED:
            number = len(job.attempts) + 1
            session.add(Attempt(job_id=job.id, number=number, backend_name=attempt_name(job.id, number),
                                status=AttemptStatus.SUBMITTING, nodes=[]))
            transition(session, job, S.SUBMITTING, actor=ctx.actor,
                       message=f"attempt {number} to {job.backend}", data={"attempt": number})
        else:
            number = len(job.attempts)
            add_event(session, job, actor=ctx.actor, kind=EventKind.RESUME_SUBMIT,
                      message=f"resuming attempt {number} after an interrupted submission")
        _, token = create_token(session, role=Role.JOB, job_id=job.id, name=attempt_name(job.id, number))
        req = build_request(job.id, number, plan=job.plan, spec=job.spec, team=job.team.name, token=token,
                            api_url=ctx.config.api_url,
                            kueue=kueue_queue_for(session, job.pool, job.team.name, job.priority))
    failpoint("after-submitting-commit")
    try:
        handle = backend.find(req.name)
        adopted = handle is not None
        if handle is None:
            handle = backend.submit(req)
    except BackendUnavailable as exc:
        release(ctx, job_id, f"{job.backend} unreachable: {exc}", report)
        report.unreachable.append(job.backend)
        return
    except TransientBackendError as exc:
        release(ctx, job_id, f"{job.backend} could not take the submission now: {exc}", report)
        return
    except SubmissionRefused as exc:
        log.warning("%s refused %s: %s", job.backend, req.name, exc)
        with ctx.sessions.begin() as session:
            job = ctx.owned(session, job_id)
            if job is not None and job.status == S.SUBMITTING:
                refused = job.attempts[-1]
                refused.status, refused.failure, refused.exit_reason, refused.finished_at = (
                    AttemptStatus.FAILED, FailureClass.LAUNCH_ERROR, str(exc), utcnow())
                transition(session, job, S.FAILED, actor=ctx.actor,
                           message=f"{FailureClass.LAUNCH_ERROR}: {job.backend} refused the submission: {exc}",
                           data={"failure": FailureClass.LAUNCH_ERROR.value, "reason": str(exc)})
                job.lease_owner = job.lease_expires_at = None
        return
    failpoint("after-backend-answer")
    with ctx.sessions.begin() as session:
        job = session.get(Job, job_id, with_for_update=ctx.postgres)
        assert job is not None
        attempt = job.attempts[-1]
        attempt.backend_id = handle.backend_id
        if job.status == S.SUBMITTING:
            attempt.status = AttemptStatus.PENDING
            transition(session, job, S.PENDING, actor=ctx.actor,
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


def release(ctx: Context, job_id: int, why: str, report: CycleReport) -> None:
    """Give the lease up, keep the job SUBMITTING, leased again after a back-off (`not_before`), and say why."""
    with ctx.sessions.begin() as session:
        job = ctx.owned(session, job_id)
        if job is None:
            return
        add_event(session, job, actor=ctx.actor, kind=EventKind.BACKEND_UNREACHABLE, message=why)
        job.lease_owner = job.lease_expires_at = None
        job.not_before = utcnow() + timedelta(seconds=ctx.config.retry_backoff_s)
    log.warning("job %d released, tried again in %.0f s: %s", job_id, ctx.config.retry_backoff_s,
                redact_strings(why),
                extra={"job_id": job_id, "decision": "released", "backoff_s": ctx.config.retry_backoff_s})
