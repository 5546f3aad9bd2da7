"""Prometheus metrics: jobs by status and team (read at scrape time), submissions, request latency."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy.orm import Session, sessionmaker

from service.store.jobs import count_by_status_and_team


class JobsCollector(Collector):
    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self.sessions = sessions

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("shardctl_jobs", "Jobs by status and team.", labels=["status", "team"])
        with self.sessions.begin() as session:
            for status, team, count in count_by_status_and_team(session):
                family.add_metric([status, team], count)
        yield family


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
