"""Prometheus metrics: jobs by status and team and the queue lag (read at scrape time), submissions,
request latency, and the job, dispatcher and delivery metrics of `service.observability.counters`
(docs/observability.md lists them all).

What a scrape shows (`exposition`) and who may scrape (`authorize_scrape`) follow the settings: with
`metrics_team_labels` off (the default) every series is summed over its `team` label, so a scrape
names no team; with `metrics_token` set, a scrape needs that token or an admin token.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session, sessionmaker

from service.api.errors import ApiError
from service.api.scheduling_metrics import SchedulingCollector
from service.lifecycle import UNSUBMITTED
from service.observability import counters
from service.observability import exposition as shown
from service.observability.exposition import TEAM_LABEL, WithoutTeams
from service.settings import Settings
from service.store.jobs import count_by_status_and_team
from service.store.models import Job, Team, as_utc, utcnow
from service.store.tokens import authenticate
from service.store.vocab import Role

__all__ = ["TEAM_LABEL", "JobsCollector", "Metrics", "QueueLagCollector", "WithoutTeams", "authorize_scrape",
           "exposition", "make_metrics"]


class JobsCollector(Collector):
    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self.sessions = sessions

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("shardctl_jobs", "Jobs by status and team.", labels=["status", "team"])
        with self.sessions.begin() as session:
            for status, team, count in count_by_status_and_team(session):
                family.add_metric([status, team], count)
        yield family


class QueueLagCollector(Collector):
    """`shardctl_queue_lag_seconds`: how long the longest-waiting job that a dispatcher could lease now
    (QUEUED, or SUBMITTING with an expired lease, and no retry's back-off under way) has waited, since it
    was queued, its lease expired or its back-off ended; 0 when none waits. One series per team with
    `team_labels` (a team with none waiting has none), else the maximum over teams. Read from the
    database at scrape time with one aggregate, so it keeps growing while no dispatcher runs."""

    def __init__(self, sessions: sessionmaker[Session], *, team_labels: bool) -> None:
        self.sessions, self.team_labels = sessions, team_labels

    def collect(self) -> Iterator[GaugeMetricFamily]:
        now = utcnow()
        since = func.min(func.coalesce(Job.lease_expires_at, Job.not_before, Job.updated_at))
        waiting = (Job.status.in_(UNSUBMITTED), or_(Job.lease_expires_at.is_(None), Job.lease_expires_at < now),
                   or_(Job.not_before.is_(None), Job.not_before < now))
        help_text = "Age of the oldest job waiting to be leased (0: none waits)."
        with self.sessions.begin() as session:
            if self.team_labels:
                rows = session.execute(select(Team.name, since).join(Team, Team.id == Job.team_id)
                                       .where(*waiting).group_by(Team.name)).all()
            else:
                oldest = session.scalar(select(since).where(*waiting))
        if self.team_labels:
            family = GaugeMetricFamily("shardctl_queue_lag_seconds", help_text, labels=[TEAM_LABEL])
            for team, at in rows:
                family.add_metric([team], _age(now, at))
        else:
            family = GaugeMetricFamily("shardctl_queue_lag_seconds", help_text,
                                       value=0.0 if oldest is None else _age(now, oldest))
        yield family


def _age(now: datetime, value: object) -> float:
    """Seconds from `value` (an aggregate's timestamp: a datetime, or SQLite's stored text) to `now`."""
    at = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return max(0.0, (now - as_utc(at)).total_seconds())


@dataclass
class Metrics:
    registry: CollectorRegistry
    submissions: Counter
    latency: Histogram


def make_metrics(sessions: sessionmaker[Session], *, team_labels: bool = False) -> Metrics:
    """The API's registry: jobs by status and the queue lag (read at scrape time), submissions and request
    latency (this process), and the job, dispatcher and delivery metrics this process counted
    (`service.observability.counters`: all of them when the dispatcher runs in this process)."""
    registry = CollectorRegistry()
    registry.register(JobsCollector(sessions))
    registry.register(QueueLagCollector(sessions, team_labels=team_labels))
    registry.register(SchedulingCollector(sessions, team_labels=team_labels))  # shared GPUs: usage, quotas, admission
    registry.register(counters.REGISTRY)
    return Metrics(
        registry=registry,
        submissions=Counter("shardctl_job_submissions", "Jobs created through the API.", ["team"],
                            registry=registry),
        latency=Histogram("shardctl_http_request_duration_seconds", "API request latency.",
                          ["method", "route", "status"], registry=registry,
                          buckets=(0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)),
    )


def exposition(metrics: Metrics, *, team_labels: bool) -> bytes:
    """The text a scrape returns: every series as is with `team_labels`, else summed over teams."""
    return shown.exposition(metrics.registry, team_labels=team_labels)


def authorize_scrape(settings: Settings, sessions: sessionmaker[Session], bearer: str | None) -> None:
    """Nothing to check without `settings.metrics_token`; with it, the bearer must be that token or an
    admin token (401 without a bearer or with an unknown one, 403 with another role's token)."""
    if settings.metrics_token is None:
        return
    if bearer:
        if hmac.compare_digest(bearer.encode(), settings.metrics_token.get_secret_value().encode()):
            return
        with sessions.begin() as session:
            principal = authenticate(session, bearer)
        if principal is not None:
            if principal.role == Role.ADMIN:
                return
            raise ApiError(403, "forbidden", "/metrics needs the metrics token or an admin token")
    raise ApiError(401, "unauthorized", "/metrics needs 'Authorization: Bearer <token>': the metrics token"
                   " (SHARDCTL_METRICS_TOKEN) or an admin token", headers={"WWW-Authenticate": "Bearer"})
