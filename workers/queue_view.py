"""The dispatcher keeps the queue view fresh, so "why pending" is a lookup (`service.store.queue_view`).

`QueueViewWriter.maybe_refresh` runs after each dispatcher cycle: it builds a snapshot of the store
as it is after that cycle's admissions, runs `service.scheduling.queue_view.queue_view` and replaces
the stored view, in one transaction. It spends at most `budget` of the dispatcher's time on it: after
a refresh that took `d` seconds, the next waits `d * (1 / budget - 1)` (a queue of a few hundred jobs
refreshes every cycle; 10,000 jobs, about one second each, every ten or so). On PostgreSQL, a
transaction-scoped advisory lock lets one replica refresh at a time (the others skip: the view is the
same from any of them), and a change to pools or quotas waits for it before dropping the view. A
failed refresh is logged and leaves the previous view, which ages out.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from service.scheduling.queue_view import queue_view
from service.scheduling.snapshot import SnapshotParams, build_snapshot
from service.store.models import utcnow
from service.store.queue_view import QUEUE_VIEW_LOCK_KEY, write_view

log = logging.getLogger("shardctl.dispatcher")


@dataclass
class QueueViewWriter:
    sessions: sessionmaker[Session]
    params: SnapshotParams = field(default_factory=SnapshotParams)
    budget: float = 0.1  # the most of the dispatcher's time refreshes may take
    _next_at: float = 0.0

    def maybe_refresh(self) -> bool:
        """Refresh the view unless the time budget says wait, or another replica holds the lock.
        Returns whether it wrote one."""
        if time.monotonic() < self._next_at:
            return False
        return self.refresh()

    def refresh(self) -> bool:
        """Refresh the view now (the budget counts this one too), unless another replica holds the lock.
        Returns whether it wrote one."""
        started = time.perf_counter()
        with self.sessions.begin() as session:
            if session.get_bind().dialect.name == "postgresql" and not session.execute(
                    text("SELECT pg_try_advisory_xact_lock(:key)"), {"key": QUEUE_VIEW_LOCK_KEY}).scalar():
                return False
            now = utcnow()
            entries = queue_view(build_snapshot(session, self.params, now=now))
            write_view(session, entries, computed_at=now, seconds=time.perf_counter() - started)
        took = time.perf_counter() - started
        self._next_at = time.monotonic() + took * (1 / self.budget - 1)
        log.debug("queue view: %d waiting jobs in %.3f s", len(entries), took,
                  extra={"decision": "queue_view", "jobs": len(entries), "seconds": took})
        return True


__all__ = ["QueueViewWriter"]
