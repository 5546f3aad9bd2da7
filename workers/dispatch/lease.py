"""The lease phase: admission's lease in one transaction (`workers.admission`), then the preemptions its
decision asks for, after the commit."""

from __future__ import annotations

import logging

from service.store.models import utcnow
from workers import admission
from workers.backends.base import BackendUnavailable, TransientBackendError
from workers.dispatch.context import Context
from workers.dispatch.preempt import preempt

log = logging.getLogger("shardctl.dispatcher")


def lease(ctx: Context) -> list[int]:
    """Take up to `batch` submittable jobs: those that hold an admission already (an interrupted
    submission, an admitted job not yet leased, a backend admission does not manage), then those
    the scheduling engine admits now, in its order (`workers.admission`). Returns their ids.
    The preemptions the decision asks for are carried out after it commits (`preempt`); a backend
    that cannot be reached leaves the victim running, and the next cycle decides again."""
    config = ctx.config
    with ctx.sessions.begin() as session:
        leased = admission.lease(session, now=utcnow(), owner=config.owner, lease_s=config.lease_s,
                                 batch=config.batch, params=config.scheduling)
    for chosen in leased.decision.preempted if leased.decision is not None else []:
        try:
            preempt(ctx, chosen.victim, by=chosen.by, reason=chosen.reason)
        except (BackendUnavailable, TransientBackendError) as exc:
            log.warning("job %d not preempted this cycle: %s", chosen.victim, exc,
                        extra={"job_id": chosen.victim, "decision": "preempt_failed", "by": chosen.by})
    return leased.ids
