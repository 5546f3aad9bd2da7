"""`/metrics` for shared GPUs, read at scrape time with a few aggregates (no document is loaded):

- `shardctl_gpu_usage_seconds_total{team,gpu}`: GPU-seconds used by every attempt seen running
- `shardctl_gpu_quota{team,gpu,limit}`: declared quotas (`limit`: nominal, borrowing_limit, lending_limit;
  an absent limit is no series)
- `shardctl_gpus_admitted{team,gpu}`, `shardctl_gpus_borrowed{team,gpu}`: GPUs admitted jobs hold now, and
  of those the GPUs above the team's nominal quota
- `shardctl_pending_jobs{team,gpu}`, `shardctl_pending_gpus{team,gpu}`: what waits for admission
- `shardctl_admission_wait_seconds{team,gpu}`: how long the oldest job waiting for admission has waited
  (per team with team labels; else the longest over teams, per kind)

Without `metrics_team_labels` the exposition sums the `team` label away (totals per kind).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from datetime import datetime

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from service.lifecycle import HOLDING
from service.observability.exposition import TEAM_LABEL
from service.store.models import Job, Team, as_utc, utcnow
from service.store.quotas import all_quotas
from service.store.usage import total_gpu_seconds
from service.store.vocab import JobStatus

S = JobStatus
LABELS = [TEAM_LABEL, "gpu"]


class SchedulingCollector(Collector):
    def __init__(self, sessions: sessionmaker[Session], *, team_labels: bool) -> None:
        self.sessions, self.team_labels = sessions, team_labels

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        now = utcnow()
        with self.sessions.begin() as session:
            used = total_gpu_seconds(session, now=now)
            quotas = all_quotas(session)
            admitted = session.execute(
                select(Team.name, Job.gpu, func.sum(Job.gpus)).join(Team, Team.id == Job.team_id)
                .where(Job.status.in_(HOLDING), Job.pool.is_not(None)).group_by(Team.name, Job.gpu)).all()
            pending = session.execute(
                select(Team.name, Job.gpu, func.count(Job.id), func.sum(Job.gpus), func.min(Job.created_at))
                .join(Team, Team.id == Job.team_id)
                .where(Job.status == S.QUEUED, Job.pool.is_(None)).group_by(Team.name, Job.gpu)).all()
        usage = CounterMetricFamily("shardctl_gpu_usage_seconds", "GPU-seconds used by attempts seen running.",
                                    labels=LABELS)
        for (team, gpu), seconds in sorted(used.items()):
            usage.add_metric([team, gpu], seconds)
        yield usage
        quota = GaugeMetricFamily("shardctl_gpu_quota", "Declared quota per team and GPU kind.",
                                  labels=[*LABELS, "limit"])
        for team, q in sorted(quotas.items()):
            for gpu, f in sorted(q.flavors.items()):
                for limit in ("nominal", "borrowing_limit", "lending_limit"):
                    value = getattr(f, limit)
                    if value is not None:
                        quota.add_metric([team, gpu, limit], value)
        yield quota
        held = GaugeMetricFamily("shardctl_gpus_admitted", "GPUs admitted jobs hold now.", labels=LABELS)
        borrowed = GaugeMetricFamily("shardctl_gpus_borrowed", "GPUs held above the team's nominal quota.",
                                     labels=LABELS)
        for team, gpu, gpus in admitted:
            nominal = quotas[team].flavors[gpu].nominal if team in quotas and gpu in quotas[team].flavors else 0
            held.add_metric([team, gpu], int(gpus or 0))
            borrowed.add_metric([team, gpu], max(0, int(gpus or 0) - nominal))
        yield held
        yield borrowed
        jobs = GaugeMetricFamily("shardctl_pending_jobs", "Jobs waiting for admission.", labels=LABELS)
        gpus_waiting = GaugeMetricFamily("shardctl_pending_gpus", "GPUs jobs waiting for admission need.",
                                         labels=LABELS)
        oldest: dict[tuple[str, str], float] = {}
        for team, gpu, count, gpus, first in pending:
            jobs.add_metric([team, gpu], int(count))
            gpus_waiting.add_metric([team, gpu], int(gpus or 0))
            if first is not None:  # SQLite's aggregate is the stored text
                at = first if isinstance(first, datetime) else datetime.fromisoformat(str(first))
                oldest[(team, gpu)] = max(0.0, (now - as_utc(at)).total_seconds())
        yield jobs
        yield gpus_waiting
        help_text = "Age of the oldest job waiting for admission."
        if self.team_labels:
            wait = GaugeMetricFamily("shardctl_admission_wait_seconds", help_text, labels=LABELS)
            for (team, gpu), age in sorted(oldest.items()):
                wait.add_metric([team, gpu], age)
        else:
            longest: dict[str, float] = defaultdict(float)
            for (_, gpu), age in oldest.items():
                longest[gpu] = max(longest[gpu], age)
            wait = GaugeMetricFamily("shardctl_admission_wait_seconds", help_text, labels=["gpu"])
            for gpu, age in sorted(longest.items()):
                wait.add_metric([gpu], age)
        yield wait


__all__ = ["SchedulingCollector"]
