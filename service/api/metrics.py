"""Prometheus metrics: jobs by status and team (read at scrape time), submissions, request latency.

What a scrape shows (`exposition`) and who may scrape (`authorize_scrape`) follow the settings: with
`metrics_team_labels` off (the default) every series is summed over its `team` label, so a scrape
names no team; with `metrics_token` set, a scrape needs that token or an admin token.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from sqlalchemy.orm import Session, sessionmaker

from service.api.errors import ApiError
from service.settings import Settings
from service.store.jobs import count_by_status_and_team
from service.store.tokens import authenticate
from service.store.vocab import Role

TEAM_LABEL = "team"


class JobsCollector(Collector):
    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self.sessions = sessions

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("shardctl_jobs", "Jobs by status and team.", labels=["status", "team"])
        with self.sessions.begin() as session:
            for status, team, count in count_by_status_and_team(session):
                family.add_metric([status, team], count)
        yield family


class WithoutTeams(Collector):
    """The metrics of `source` with the `team` label summed away (a `_created` sample keeps the earliest)."""

    def __init__(self, source: CollectorRegistry) -> None:
        self.source = source

    def collect(self) -> Iterator[Metric]:
        for metric in self.source.collect():
            if not any(TEAM_LABEL in sample.labels for sample in metric.samples):
                yield metric
                continue
            merged: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
            for sample in metric.samples:
                key = (sample.name, tuple(sorted((k, v) for k, v in sample.labels.items() if k != TEAM_LABEL)))
                if key not in merged:
                    merged[key] = sample.value
                elif sample.name.endswith("_created"):
                    merged[key] = min(merged[key], sample.value)
                else:
                    merged[key] += sample.value
            out = Metric(metric.name, metric.documentation, metric.type, metric.unit)
            for (name, labels), value in merged.items():
                out.add_sample(name, dict(labels), value)
            yield out


@dataclass
class Metrics:
    registry: CollectorRegistry
    submissions: Counter
    latency: Histogram


def make_metrics(sessions: sessionmaker[Session]) -> Metrics:
    registry = CollectorRegistry()
    registry.register(JobsCollector(sessions))
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
    if team_labels:
        return generate_latest(metrics.registry)
    view = CollectorRegistry(auto_describe=False)
    view.register(WithoutTeams(metrics.registry))
    return generate_latest(view)


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
