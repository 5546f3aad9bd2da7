"""A job's life: its states' named sets and which state may follow which. The one home of both: no
other module lists job states as a set, and `service.store.states.transition`, the only writer of a
job's status, refuses any move `ALLOWED` does not hold.

Pure: no store, no I/O. The statuses themselves are the enum `service.store.vocab.JobStatus`.

The table, drawn (`diagram()` makes this text from `ALLOWED`; a test keeps docs/architecture.md's copy
equal to it):

```
QUEUED      -> SUBMITTING, CANCELLED
SUBMITTING  -> QUEUED, PENDING, RUNNING, CANCELLING, SUCCEEDED, FAILED
PENDING     -> QUEUED, RUNNING, CANCELLING, SUCCEEDED, FAILED
RUNNING     -> QUEUED, CANCELLING, SUCCEEDED, FAILED
CANCELLING  -> SUCCEEDED, FAILED, CANCELLED
SUCCEEDED   (terminal)
FAILED      (terminal)
CANCELLED   (terminal)
```

A move back to QUEUED is a retry or a preemption; a job that was submitted goes through CANCELLING
(the backend must stop it) before CANCELLED, and may still end SUCCEEDED or FAILED meanwhile.
"""

from __future__ import annotations

from service.store.vocab import JobStatus

S = JobStatus

#: Final: nothing follows.
TERMINAL: frozenset[JobStatus] = frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED})
#: Not started yet: in the queue, being handed to a backend, or accepted by it and waiting for nodes.
WAITING: frozenset[JobStatus] = frozenset({S.QUEUED, S.SUBMITTING, S.PENDING})
#: Not yet handed to a backend for good: what a dispatcher leases and submits.
UNSUBMITTED: frozenset[JobStatus] = frozenset({S.QUEUED, S.SUBMITTING})
#: A backend holds an attempt of it: what the dispatcher polls and reconciles.
TRACKED: frozenset[JobStatus] = frozenset({S.PENDING, S.RUNNING, S.CANCELLING})
#: Handed to a backend and not ended: an attempt exists, whose observation moves the job on.
SUBMITTED: frozenset[JobStatus] = frozenset({S.SUBMITTING, S.PENDING, S.RUNNING})
#: Not terminal: the job holds, or (QUEUED with a pool) is about to use, its admission.
HOLDING: frozenset[JobStatus] = frozenset(s for s in S if s not in TERMINAL)
#: At a backend and not being cancelled: what admission may preempt.
PREEMPTIBLE: frozenset[JobStatus] = frozenset({S.PENDING, S.RUNNING})
#: Handed to a backend that has not started it: the backend's own reason for holding it is worth showing.
AT_BACKEND_WAITING: frozenset[JobStatus] = frozenset({S.SUBMITTING, S.PENDING})
#: Reached once per job whatever the retries: the first entry into each is what the job metrics time.
MILESTONES: frozenset[JobStatus] = frozenset({S.SUBMITTING, S.RUNNING})

ALLOWED: dict[JobStatus, frozenset[JobStatus]] = {
    S.QUEUED: frozenset({S.SUBMITTING, S.CANCELLED}),
    S.SUBMITTING: frozenset({S.PENDING, S.RUNNING, S.SUCCEEDED, S.FAILED, S.QUEUED, S.CANCELLING}),
    S.PENDING: frozenset({S.RUNNING, S.SUCCEEDED, S.FAILED, S.QUEUED, S.CANCELLING}),
    S.RUNNING: frozenset({S.SUCCEEDED, S.FAILED, S.QUEUED, S.CANCELLING}),
    S.CANCELLING: frozenset({S.CANCELLED, S.SUCCEEDED, S.FAILED}),
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
}


def allowed(current: JobStatus, wanted: JobStatus) -> bool:
    """Whether a job in `current` may move to `wanted`."""
    return wanted in ALLOWED[current]


def diagram() -> str:
    """The transition table as text, one line per status in the enum's order (each target list in the
    same order): the drawing in this module's docstring and in docs/architecture.md."""
    order = list(S)
    width = max(len(s.value) for s in order) + 1
    lines = []
    for status in order:
        targets = sorted(ALLOWED[status], key=order.index)
        lines.append(f"{status.value:<{width}} -> {', '.join(t.value for t in targets)}" if targets
                     else f"{status.value:<{width}} (terminal)")
    return "\n".join(lines)


__all__ = ["ALLOWED", "AT_BACKEND_WAITING", "HOLDING", "MILESTONES", "PREEMPTIBLE", "SUBMITTED", "TERMINAL",
           "TRACKED", "UNSUBMITTED", "WAITING", "allowed", "diagram"]
