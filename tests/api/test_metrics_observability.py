"""Prometheus after real jobs run through the local backend: queue wait, time to running, attempts,
failures by class, finished jobs, dispatcher cycles, the queue lag read from the database, webhook
deliveries by outcome; per team only when allowed; and `shardctl worker`'s own metrics port."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from service.api.app import create_app
from service.settings import Settings
from service.store.db import make_engine
from tests.db_fixtures import Env
from tests.log_capture import captured_logs
from tests.specs import tiny
from tests.support.dispatch import drive, make_dispatcher, one_process

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(text: str) -> Samples:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def delta(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def test_a_job_run_shows_its_queue_wait_time_to_running_attempt_and_the_cycles(env: Env, admin: dict[str, str],
                                                                                tmp_path: Path) -> None:
    before = scrape(env.client.get("/metrics").text)
    job_id = env.client.post("/v1/jobs", json=one_process("import time; time.sleep(4)"), headers=admin).json()["id"]
    dispatcher = make_dispatcher(env, tmp_path)
    drive(env, dispatcher, job_id, admin, until={"RUNNING"})  # seen running: time to running is observed
    assert drive(env, dispatcher, job_id, admin)["status"] == "SUCCEEDED"
    text = env.client.get("/metrics").text
    after = scrape(text)
    local = {"backend": "local"}
    assert delta(before, after, "shardctl_job_queue_wait_seconds_count", **local) == 1
    assert delta(before, after, "shardctl_job_time_to_running_seconds_count", **local) == 1
    waited = delta(before, after, "shardctl_job_queue_wait_seconds_sum", **local)
    assert 0 <= waited <= delta(before, after, "shardctl_job_time_to_running_seconds_sum", **local)
    assert delta(before, after, "shardctl_job_attempts_total", **local) == 1
    assert delta(before, after, "shardctl_jobs_finished_total", status="SUCCEEDED", **local) == 1
    assert delta(before, after, "shardctl_dispatcher_cycle_seconds_count", outcome="ok") >= 2
    assert "team=" not in text  # summed over teams unless metrics_team_labels


def test_failures_are_counted_by_the_class_the_job_records(env: Env, admin: dict[str, str], tmp_path: Path) -> None:
    before = scrape(env.client.get("/metrics").text)
    job_id = env.client.post("/v1/jobs", json=one_process("import sys; sys.exit(3)"), headers=admin).json()["id"]
    assert drive(env, make_dispatcher(env, tmp_path), job_id, admin)["status"] == "FAILED"
    failure = env.client.get(f"/v1/jobs/{job_id}/events", headers=admin).json()[-1]["data"]["failure"]
    after = scrape(env.client.get("/metrics").text)
    assert failure
    assert delta(before, after, "shardctl_job_attempt_failures_total", backend="local", failure_class=failure) == 1
    assert delta(before, after, "shardctl_jobs_finished_total", backend="local", status="FAILED") == 1


def test_the_queue_lag_grows_while_a_job_waits_and_is_zero_once_it_is_leased(env: Env, admin: dict[str, str],
                                                                            tmp_path: Path) -> None:
    def lag() -> float:
        return value(scrape(env.client.get("/metrics").text), "shardctl_queue_lag_seconds")

    assert lag() == 0.0
    job_id = env.client.post("/v1/jobs", json=one_process("print(1)"), headers=admin).json()["id"]
    first = lag()
    deadline = time.monotonic() + 10
    while (second := lag()) <= first:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert 0 < first < second  # the oldest waiting job's age
    make_dispatcher(env, tmp_path).run_once()  # leased and submitted: nothing waits
    assert lag() == 0.0
    drive(env, make_dispatcher(env, tmp_path), job_id, admin)


def test_team_labels_only_when_allowed(env: Env, admin: dict[str, str], tmp_path: Path) -> None:
    settings = Settings(database_url=env.url, data_dir=tmp_path, metrics_team_labels=True)
    env.client.post("/v1/teams", json={"name": "alpha"}, headers=admin)
    with TestClient(create_app(settings, engine=make_engine(env.url))) as client:
        before = scrape(client.get("/metrics").text)
        job_id = client.post("/v1/jobs", json=one_process("print(1)", team="alpha"), headers=admin).json()["id"]
        waiting = scrape(client.get("/metrics").text)
        drive(env, make_dispatcher(env, tmp_path), job_id, admin)
        after = scrape(client.get("/metrics").text)
    assert value(waiting, "shardctl_queue_lag_seconds", team="alpha") > 0
    assert delta(before, after, "shardctl_job_queue_wait_seconds_count", team="alpha", backend="local") == 1
    assert delta(before, after, "shardctl_jobs_finished_total", team="alpha", backend="local",
                 status="SUCCEEDED") == 1


def test_webhook_deliveries_are_counted_by_outcome(env: Env, admin: dict[str, str]) -> None:
    """A real receiver on loopback answers 500, then 200: one retrying attempt, one delivered."""
    from tests.notify.helpers import notifier, pump, submit, subscribe
    from tests.notify.receiver import receiver

    env.app.state.settings.webhook_allow_private = True  # the receiver is on 127.0.0.1
    before = scrape(env.client.get("/metrics").text)
    with receiver([500, 200]) as rec:
        subscribe(env, admin, rec.url, ["job.queued"])
        submit(env, admin)
        pump(notifier(env), env, rec, 2)
    after = scrape(env.client.get("/metrics").text)
    assert delta(before, after, "shardctl_webhook_deliveries_total", outcome="retrying") == 1
    assert delta(before, after, "shardctl_webhook_deliveries_total", outcome="delivered") == 1
    assert delta(before, after, "shardctl_webhook_delivery_seconds_count", outcome="delivered") == 1


def test_a_worker_serves_its_own_metrics_and_logs_json(env: Env, admin: dict[str, str], tmp_path: Path) -> None:
    """`shardctl worker` apart from the API: its decisions and job metrics are on its own port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    environ = {**os.environ, "SHARDCTL_DATABASE_URL": env.url, "SHARDCTL_DATA_DIR": str(tmp_path),
               "SHARDCTL_DISPATCHER_METRICS_PORT": str(port), "SHARDCTL_LOG_FORMAT": "json",
               "SHARDCTL_DISPATCHER_INTERVAL_S": "0.2"}
    proc = subprocess.Popen([sys.executable, "-m", "service.cli.main", "worker"], env=environ,
                            stderr=subprocess.PIPE, text=True)
    try:
        job_id = env.client.post("/v1/jobs", json=one_process("print(1)"), headers=admin).json()["id"]
        deadline = time.monotonic() + 120
        while env.client.get(f"/v1/jobs/{job_id}", headers=admin).json()["status"] != "SUCCEEDED":
            assert time.monotonic() < deadline and proc.poll() is None, "the worker did not run the job"
            time.sleep(0.2)
        metrics = scrape(httpx.get(f"http://127.0.0.1:{port}/metrics").text)
    finally:
        proc.terminate()
        _, stderr = proc.communicate(timeout=30)
    assert value(metrics, "shardctl_job_queue_wait_seconds_count", backend="local") == 1
    assert value(metrics, "shardctl_jobs_finished_total", backend="local", status="SUCCEEDED") == 1
    assert value(metrics, "shardctl_dispatcher_cycle_seconds_count", outcome="ok") >= 1
    lines = [json.loads(line) for line in stderr.splitlines() if line.strip()]  # every line parses
    assert [r["to"] for r in lines if r["logger"] == "shardctl.jobs" and r["job_id"] == job_id][-1] == "SUCCEEDED"
    assert any(r.get("decision") == "submitted" and r["job_id"] == job_id for r in lines)


def test_a_rolled_back_transition_is_neither_logged_nor_counted(env: Env, admin: dict[str, str]) -> None:
    from service.store.models import Job
    from service.store.states import transition
    from service.store.vocab import JobStatus

    job_id = env.client.post("/v1/jobs", json=tiny(), headers=admin).json()["id"]
    before = scrape(env.client.get("/metrics").text)
    with captured_logs() as logs, env.app.state.sessions() as session:
        job = session.get(Job, job_id)
        transition(session, job, JobStatus.SUBMITTING, actor="test")
        session.flush()
        session.rollback()
    after = scrape(env.client.get("/metrics").text)
    assert logs.records("shardctl.jobs", job_id=job_id) == []
    assert delta(before, after, "shardctl_job_attempts_total", backend="local") == 0
    assert env.client.get(f"/v1/jobs/{job_id}", headers=admin).json()["status"] == "QUEUED"
