"""How a registry is shown to a scrape: every series as counted with team labels allowed, else summed
over the `team` label (`metrics_team_labels` off: a scrape names no team). The API's `/metrics` and the
dispatcher's own metrics port (`serve_metrics`) show the same way."""

from __future__ import annotations

from collections.abc import Iterator
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

TEAM_LABEL = "team"


class WithoutTeams(Collector):
    """The metrics of `source` with the `team` label summed away (a `_created` sample keeps the earliest)."""

    def __init__(self, source: Collector) -> None:
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


def scrape_view(registry: CollectorRegistry, *, team_labels: bool) -> CollectorRegistry:
    """`registry` itself with `team_labels`, else a registry that shows it summed over teams."""
    if team_labels:
        return registry
    view = CollectorRegistry(auto_describe=False)
    view.register(WithoutTeams(registry))
    return view


def exposition(registry: CollectorRegistry, *, team_labels: bool) -> bytes:
    """The text a scrape of `registry` returns."""
    return generate_latest(scrape_view(registry, team_labels=team_labels))


def serve_metrics(registry: CollectorRegistry, *, host: str, port: int, team_labels: bool) -> WSGIServer:
    """Serve `registry` for Prometheus on `host:port` from a daemon thread (the dispatcher's own port: it
    has no API); returns the server (`server_address` holds the port when `port` is 0). Unauthenticated:
    bind it where only the scraper reaches."""
    server, _ = start_http_server(port, addr=host, registry=scrape_view(registry, team_labels=team_labels))
    return server
