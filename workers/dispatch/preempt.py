"""The preempt phase: a running job stopped with notice because another needs its devices (`preempt`),
and notice given again to attempts marked as preempted whose notice this process did not send
(`resend_notices`)."""

from __future__ import annotations

import contextlib
import logging

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.lifecycle import PREEMPTIBLE
from service.store.models import Attempt, Job
from service.store.states import add_event
from service.store.vocab import EventKind, FailureClass
from workers.backends.base import Backend, BackendUnavailable, Handle, TransientBackendError
from workers.dispatch.context import Context, failpoint

log = logging.getLogger("shardctl.dispatcher")


def preempt(ctx: Context, job_id: int, *, by: int, reason: str) -> None:
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
    grace = ctx.config.preempt_grace_s
    marked = mark_preempted(ctx, job_id, by=by, reason=reason)
    if marked is None:
        return
    attempt_id, backend, handle = marked
    failpoint("after-preempt-mark")
    try:
        backend.preempt(handle, grace)
        ctx.notice_sent.add(attempt_id)
    except (BackendUnavailable, TransientBackendError) as exc:
        with ctx.sessions.begin() as session:
            undo = session.get(Attempt, attempt_id)
            job = session.get(Job, job_id)
            if undo is not None and job is not None and undo.finished_at is None:
                undo.failure = undo.exit_reason = None
                add_event(session, job, actor=ctx.actor, kind=EventKind.BACKEND_UNREACHABLE,
                          message=f"the preemption of attempt {undo.number} was not delivered: {exc}")
        raise


def mark_preempted(ctx: Context, job_id: int, *, by: int, reason: str) -> tuple[int, Backend, Handle] | None:
    """The first step of `preempt`, in one transaction: mark the current attempt and write the event.
    Returns what the second step needs (attempt id, backend, handle), or None to leave the job alone."""
    grace = ctx.config.preempt_grace_s
    with ctx.sessions.begin() as session:
        job = session.get(Job, job_id, with_for_update=ctx.postgres)
        backend = ctx.backends.get(job.backend) if job is not None else None
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
        add_event(session, job, actor=ctx.actor, kind=EventKind.PREEMPTED,
                  message=f"preempted by {who}: {reason} (attempt {attempt.number};"
                          f" {grace:.0f} s to checkpoint)",
                  data={"by": None if other_team is not None else by, "by_team": other_team,
                        "reason": reason, "attempt": attempt.number, "grace_s": grace})
        return attempt.id, backend, Handle(name=attempt.backend_name, backend_id=attempt.backend_id)


def resend_notices(ctx: Context, backend: Backend, marked: list[tuple[int, Handle]]) -> None:
    """Give notice again, once per dispatcher process, to attempts marked as preempted whose notice this
    process did not send: a dispatcher killed between the mark and `Backend.preempt` (or another
    replica's send) leaves no way to know whether it went out, and a mark without a notice would hold
    the victim's GPUs as "being released" until it ended by itself. Every backend's `preempt` is
    idempotent for a run that already has notice."""
    for attempt_id, handle in marked:
        if attempt_id in ctx.notice_sent:
            continue
        ctx.notice_sent.add(attempt_id)
        log.info("giving notice again to %s (marked as preempted; this dispatcher did not send it)",
                 handle.name, extra={"attempt_id": attempt_id})
        with contextlib.suppress(BackendUnavailable, TransientBackendError):
            backend.preempt(handle, ctx.config.preempt_grace_s)


def being_preempted(session: Session) -> set[int]:
    """Ids of the jobs whose current attempt has been told to stop (`preempt`) and has not ended
    yet: admission must not choose them as victims again."""
    return set(session.scalars(select(Attempt.job_id).where(Attempt.failure == FailureClass.PREEMPTED,
                                                            Attempt.finished_at.is_(None))))
