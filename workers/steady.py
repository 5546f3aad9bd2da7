"""Which backend observations change nothing in the store, decided from one row per tracked job.

A reconcile cycle reads every tracked job's current attempt in one query (`TrackedRow`), polls each
backend once, and opens a write transaction only for the jobs whose observation would change the
store (`changes_store`). With 10,000 tracked jobs nearly all of them are unchanged every cycle; a
transaction per job (a locking read of the job and its attempts, then a commit) was the cycle's cost.

`changes_store` is conservative: it answers False only in cases where `Dispatcher.apply` would write
nothing, and True for everything else (apply then decides under the row lock, as before). Skipping a
write that would not happen cannot leave the store inconsistent, whenever the dispatcher dies.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from service.store.backend_pending import ChangeKey, change_key
from service.store.models import as_utc
from service.store.vocab import FailureClass, JobStatus
from workers.backends.base import Handle, Observation, RunState


@dataclass(frozen=True, slots=True)
class TrackedRow:
    """A tracked job (PENDING, RUNNING or CANCELLING) and its current attempt, as the cycle read them.
    `runs`: how many of the job's attempts share this attempt's backend id (a backend requeue opens a
    new attempt under the same id). `ended`/`started`: whether the attempt's `finished_at`/`started_at`
    is recorded. `created_at`: as the database driver returns it (aware on PostgreSQL, naive UTC on
    SQLite; `as_utc` reads both). `nodes_json`: the attempt's `nodes` column as JSON text, decoded
    when `nodes` is read (a cycle reads it only for the observations that name nodes)."""

    job_id: int
    backend: str
    status: JobStatus
    number: int
    handle: Handle
    attempt_id: int
    failure: FailureClass | None
    ended: bool
    started: bool
    created_at: datetime
    nodes_json: str | None
    runs: int

    @property
    def nodes(self) -> list[str] | None:
        """The attempt's recorded nodes (None when the column is NULL)."""
        return None if self.nodes_json is None else json.loads(self.nodes_json)

    @property
    def marked_preempted(self) -> bool:
        """Told to stop by `Dispatcher.preempt` and not ended yet."""
        return self.failure == FailureClass.PREEMPTED and not self.ended


def changes_store(row: TrackedRow, obs: Observation, *, now: datetime, missing_grace: timedelta,
                  pending_memo: Mapping[int, tuple[int, ChangeKey]]) -> bool:
    """Whether `Dispatcher.apply(row.job_id, row.number, obs)` could write anything. False only when:
    no requeue is unrecorded, the observed nodes are the recorded ones (or none observed), and

    - RUNNING: the attempt's start is recorded and the job is not PENDING (which would move to RUNNING);
    - PENDING: the job is not PENDING, or this dispatcher recorded the same backend reason and estimate
      for this attempt already (`pending_memo`, `Dispatcher._backend_pending`);
    - MISSING: the job is not CANCELLING, its attempt is not being preempted, and the attempt is younger
      than `missing_grace`.

    Every end (SUCCEEDED, FAILED, CANCELLED) changes the store."""
    if obs.requeues > row.runs - 1:
        return True
    if obs.nodes and obs.nodes != (row.nodes or []):
        return True
    if obs.state == RunState.RUNNING:
        return not row.started or row.status == JobStatus.PENDING
    if obs.state == RunState.PENDING:
        if row.status != JobStatus.PENDING:
            return False
        return pending_memo.get(row.job_id) != (row.number, change_key(obs.pending_reason, obs.expected_start))
    if obs.state == RunState.MISSING:
        return (row.status == JobStatus.CANCELLING or row.marked_preempted
                or now - as_utc(row.created_at) > missing_grace)
    return True
