"""The re-plan phase: an attempt that ran out of memory, planned again under the memory it measured."""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy.orm import Session

from service.failures import OUT_OF_MEMORY, measured_oom
from service.lifecycle_decide import AttemptEnd
from service.planner import replan
from service.store.models import Job
from service.store.states import add_event, transition
from service.store.submissions import plan_columns
from service.store.vocab import EventKind, JobStatus

log = logging.getLogger("shardctl.dispatcher")


def replan_after_oom(session: Session, job: Job, end: AttemptEnd, data: dict[str, Any] | None, *,
                     actor: str) -> bool:
    """After the job's current attempt ended out of memory (`end`): when the spec's `recovery.replan_on_oom`
    is on and fewer than `recovery.max_replans` re-plans were made, plan the job again under the memory the
    attempt measured (`service.planner.replan.next_plan`, from the peak in its log tail), store that plan as
    the job's plan with the list's columns copied from it (`plan_columns`, as at submission; the next attempt
    runs it), append `job.replanned` naming the old and new layouts and the measured peak, and queue the job
    again at once (the transition's event carries `data`); return True. Otherwise append
    `job.replan_refused` with the reason (when recovery is on) and return False: the job fails.

    Called inside the transaction that closes the attempt, so the decision and the requeue commit
    together: a dispatcher that dies before the commit leaves the attempt open, and the next poll makes
    the same decision from the same inputs (the planner is deterministic); one that dies after it
    finds the job QUEUED with its new plan. A re-plan counts against `max_replans`, never against
    `max_attempts` (out-of-memory attempts are not counted)."""
    recovery = job.spec.recovery
    failure = end.failure
    if not recovery.replan_on_oom or failure is None:
        return False
    attempt = job.attempts[-1]
    done = sum(1 for a in job.attempts[:-1] if a.failure in OUT_OF_MEMORY)
    measured = measured_oom(end.log_tail or "")
    peak = measured.peak_bytes if measured is not None else None
    failed = job.plan
    facts = {"attempt": attempt.number, "failure": failure.value, "measured_peak_bytes": peak,
             "limit_bytes": measured.limit_bytes if measured is not None else None,
             "replans": done, "max_replans": recovery.max_replans, "layout": failed.layout.to_dict()}
    result: replan.Replan | replan.NoReplan | None = None
    if done < recovery.max_replans:
        result = replan.next_plan(job.spec, failed, failure, measured)
    if not isinstance(result, replan.Replan):
        why = (result.reason if result is not None else
               f"recovery.max_replans ({recovery.max_replans}) re-plans made already")
        add_event(session, job, actor=actor, kind=EventKind.REPLAN_REFUSED,
                  message=f"attempt {attempt.number} ran out of memory ({failure}); not planned again: {why}",
                  data={**facts, "reason": why})
        return False
    new, cap = result.plan, result.cap
    job.plan = new
    for column, value in plan_columns(new).items():
        setattr(job, column, value)
    measured_words = f"measured peak {peak:,} bytes" if peak is not None else "no peak measured"
    add_event(session, job, actor=actor, kind=EventKind.REPLANNED,
              message=f"attempt {attempt.number} ran out of memory ({failure}, {measured_words}, predicted"
                      f" {cap.predicted_bytes:,}); re-planned {failed.layout.short()} -> {new.layout.short()}"
                      f" ({result.rung} rung, re-plan {done + 1} of {recovery.max_replans})",
              data={**facts, "rung": result.rung, "old_layout": failed.layout.to_dict(),
                    "new_layout": new.layout.to_dict(), "old": failed.layout.short(), "new": new.layout.short(),
                    "predicted_bytes": cap.predicted_bytes,
                    "new_predicted_bytes": replan.predicted_allocated(new), "cap_bytes": cap.cap_bytes,
                    "scale": cap.scale, "replan": done + 1, "next_attempt": attempt.number + 1})
    transition(session, job, JobStatus.QUEUED, actor=actor,
               message=f"{failure}: {end.reason or ''}; queued again with {new.layout.short()} (re-plan"
                       f" {done + 1} of {recovery.max_replans}, not counted against max_attempts)", data=data)
    log.info("job %d re-planned after %s: %s -> %s", job.id, failure, failed.layout.short(),
             new.layout.short(), extra={"job_id": job.id, "decision": "replanned", "rung": result.rung})
    return True
