"""What every phase of the dispatcher reads and keeps (`Context`), its configuration, a cycle's report, and
the crash-test hook."""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from sqlalchemy.orm import Session, sessionmaker

from service.lifecycle_decide import RetryPolicy
from service.scheduling.snapshot import SnapshotParams
from service.store.backend_pending import ChangeKey
from service.store.models import Job
from workers.backends.base import Backend

FAILPOINT_ENV = "SHARDCTL_FAILPOINT"
#: how long an attempt the backend does not know may stay unknown before it counts as lost
MISSING_GRACE = timedelta(seconds=60)


def failpoint(name: str) -> None:
    """Crash-test hook: when $SHARDCTL_FAILPOINT names this point, die here by SIGKILL (no cleanup),
    as a machine failure would. Points: after-submitting-commit, after-backend-answer, after-preempt-mark,
    notify-before-send."""
    if os.environ.get(FAILPOINT_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass
class DispatcherConfig:
    owner: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")
    lease_s: float = 60.0
    batch: int = 16
    max_attempts: int = 3
    retry_backoff_s: float = 5.0
    api_url: str | None = None
    preempt_grace_s: float = 30.0  # notice a preempted job gets to checkpoint before it is killed
    #: what admission reads besides the store (local GPUs, usage half-life, blend, minimum runtime)
    scheduling: SnapshotParams = field(default_factory=SnapshotParams)


@dataclass
class CycleReport:
    submitted: int = 0
    adopted: int = 0
    transitions: int = 0
    unreachable: list[str] = field(default_factory=list)


class Context:
    """A dispatcher's sessions, backends (keyed by `spec.backend.kind`) and configuration, and what it
    remembers between cycles: `backend_pending` (job id -> the attempt and the backend's pending reason
    and estimate last recorded, `workers.dispatch.reconcile`) and `notice_sent` (attempts this process
    gave preemption notice to, `workers.dispatch.preempt`)."""

    def __init__(self, sessions: sessionmaker[Session], backends: Mapping[str, Backend],
                 config: DispatcherConfig | None = None) -> None:
        self.sessions = sessions
        self.backends = dict(backends)
        self.config = config or DispatcherConfig()
        self.postgres = sessions.kw["bind"].dialect.name == "postgresql"
        self.backend_pending: dict[int, tuple[int, ChangeKey]] = {}
        self.notice_sent: set[int] = set()

    @property
    def actor(self) -> str:
        return f"dispatcher:{self.config.owner}"

    @property
    def policy(self) -> RetryPolicy:
        return RetryPolicy(max_attempts=self.config.max_attempts, backoff_s=self.config.retry_backoff_s,
                           missing_grace=MISSING_GRACE)

    def owned(self, session: Session, job_id: int) -> Job | None:
        """Job `job_id`, locked on PostgreSQL, when this dispatcher holds its lease; else None."""
        job = session.get(Job, job_id, with_for_update=self.postgres)
        if job is None or job.lease_owner != self.config.owner:
            return None
        return job
