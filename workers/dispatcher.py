"""The dispatcher: turns queued jobs into backend submissions, exactly once, and keeps their status true.

One cycle (`Dispatcher.run_once`) runs the phases of `workers.dispatch`, each in its own module:

1. **Lease** up to `batch` submittable jobs (`workers.dispatch.lease`, through `workers.admission`), and
   preempt the jobs admission asks to (`workers.dispatch.preempt`).
2. **Submit** each leased job (`workers.dispatch.submit`): SUBMITTING and the attempt row committed, then
   find-or-submit outside any transaction, then PENDING; nothing is submitted twice whenever it crashes.
3. **Reconcile** every tracked job with one `poll` per backend (`workers.dispatch.reconcile`): each
   observation goes through `service.lifecycle_decide.decide`, and what it changes is written (an
   out-of-memory end may re-plan the job, `workers.dispatch.replan`).
4. **Refresh the queue view** (`workers.queue_view`).

(A job's token stops working `job_token_grace_s` after the job ends: `service.store.tokens.authenticate`
derives it.)
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping

from sqlalchemy.orm import Session, sessionmaker

from service.observability import counters
from workers.backends.base import Backend, Observation
from workers.dispatch import lease, preempt, reconcile, submit
from workers.dispatch.context import Context, CycleReport, DispatcherConfig
from workers.queue_view import QueueViewWriter

log = logging.getLogger("shardctl.dispatcher")


class Dispatcher(Context):
    """Leases, submits and reconciles jobs against `backends` (keyed by `spec.backend.kind`)."""

    def __init__(self, sessions: sessionmaker[Session], backends: Mapping[str, Backend],
                 config: DispatcherConfig | None = None) -> None:
        super().__init__(sessions, backends, config)
        #: "why pending" as a lookup: the queue view, refreshed after each cycle (`workers.queue_view`)
        self.queue_view = QueueViewWriter(sessions, self.config.scheduling)

    def run_once(self) -> CycleReport:
        started, ok = time.perf_counter(), False
        try:
            report = CycleReport()
            for job_id in self.lease():
                log.info("job %d leased by %s", job_id, self.config.owner,
                         extra={"job_id": job_id, "decision": "leased", "owner": self.config.owner})
                submit.submit_one(self, job_id, report)
            self.reconcile(report)
            ok = True
            try:
                self.queue_view.maybe_refresh()
            except Exception:  # the view is a cache: explain answers live while it is missing or old
                log.exception("queue view refresh failed; explain answers live until one succeeds")
            return report
        finally:  # shardctl_dispatcher_cycle_seconds (docs/observability.md)
            counters.observe_cycle(time.perf_counter() - started, ok=ok)

    def run_forever(self, stop: threading.Event, interval_s: float = 1.0) -> None:
        while not stop.is_set():
            try:
                self.run_once()
            except Exception:
                log.exception("dispatcher cycle failed; continuing")
            stop.wait(interval_s)

    def lease(self) -> list[int]:
        """`workers.dispatch.lease.lease`."""
        return lease.lease(self)

    def reconcile(self, report: CycleReport) -> None:
        """`workers.dispatch.reconcile.reconcile`."""
        reconcile.reconcile(self, report)

    def apply(self, job_id: int, number: int, obs: Observation) -> int:
        """`workers.dispatch.reconcile.apply`."""
        return reconcile.apply(self, job_id, number, obs)

    def apply_many(self, observed: list[tuple[int, int, Observation]]) -> int:
        """`workers.dispatch.reconcile.apply_many`."""
        return reconcile.apply_many(self, observed)

    def preempt(self, job_id: int, *, by: int, reason: str) -> None:
        """`workers.dispatch.preempt.preempt`."""
        preempt.preempt(self, job_id, by=by, reason=reason)
