"""The job, dispatcher and delivery metrics each process counts as things happen, in one process-wide
registry (`REGISTRY`).

Which process shows them: the API's `/metrics` always includes `REGISTRY` (so `shardctl serve
--with-dispatcher`, the embedded default, shows everything in one scrape); a separate `shardctl worker`
serves its own `REGISTRY` on `SHARDCTL_DISPATCHER_METRICS_PORT`. Each process counts only what it did,
so a query sums over instances (`sum by (...)`). Series carry a `team` label that the scrape sums
away unless `metrics_team_labels` is set (`service.observability.exposition`).

Job metrics are observed by `service.observability.transitions` when a transition commits; the
dispatcher observes its cycles (`observe_cycle`); webhook deliveries are counted when their rows commit
(`service.observability.deliveries`).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

#: Seconds, from a second to a day: how long jobs wait.
WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 43200, 86400)

QUEUE_WAIT = Histogram(
    "shardctl_job_queue_wait_seconds",
    "From a job's creation to its first submission (QUEUED -> SUBMITTING: leased by a dispatcher).",
    ["team", "backend"], buckets=WAIT_BUCKETS, registry=REGISTRY)
TIME_TO_RUNNING = Histogram(
    "shardctl_job_time_to_running_seconds",
    "From a job's creation to the first time a backend reports it RUNNING (queue wait plus the backend's"
    " own scheduling). A job that finishes before a poll sees it running is not observed.",
    ["team", "backend"], buckets=WAIT_BUCKETS, registry=REGISTRY)
ATTEMPTS = Counter(
    "shardctl_job_attempts", "Attempts started (each QUEUED -> SUBMITTING).", ["team", "backend"],
    registry=REGISTRY)
FAILURES = Counter(
    "shardctl_job_attempt_failures",
    "Attempts that failed, by failure class (retried or final; 'unknown' when none was given).",
    ["team", "backend", "failure_class"], registry=REGISTRY)
FINISHED = Counter(
    "shardctl_jobs_finished", "Jobs that reached a terminal status.", ["team", "backend", "status"],
    registry=REGISTRY)
CYCLE = Histogram(
    "shardctl_dispatcher_cycle_seconds", "One dispatcher cycle: lease, submit, reconcile ('error': it raised).",
    ["outcome"], buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120), registry=REGISTRY)
DELIVERIES = Counter(
    "shardctl_webhook_deliveries", "Webhook delivery attempts, by outcome.", ["team", "outcome"],
    registry=REGISTRY)
DELIVERY_SECONDS = Histogram(
    "shardctl_webhook_delivery_seconds", "How long a webhook receiver took to answer (or to time out).",
    ["outcome"], buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30), registry=REGISTRY)


def record_delivery(outcome: str, *, team: str | None = None, seconds: float | None = None) -> None:
    """Count one webhook delivery attempt by its outcome (`service.store.notify_models.DeliveryOutcome`:
    delivered, retrying, failed, gave_up, disabled), and how long the receiver took when it was asked at
    all. `service.observability.deliveries` calls it when a delivery row commits."""
    label = str(getattr(outcome, "value", outcome))
    DELIVERIES.labels(team=team or "", outcome=label).inc()
    if seconds is not None:
        DELIVERY_SECONDS.labels(outcome=label).observe(seconds)


def observe_cycle(seconds: float, *, ok: bool) -> None:
    """One dispatcher cycle took `seconds` (`ok` False: it raised)."""
    CYCLE.labels(outcome="ok" if ok else "error").observe(seconds)
