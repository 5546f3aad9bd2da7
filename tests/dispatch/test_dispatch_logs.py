"""What the dispatcher and the state machine log, for a real job on the local backend: one line per
transition with the job's id, from, to and actor, and one per decision only the dispatcher makes
(leased, submitted or adopted)."""

from __future__ import annotations

from pathlib import Path

from tests.db_fixtures import Env
from tests.log_capture import captured_logs
from tests.support.dispatch import drive, make_dispatcher, one_process


def status_events(env: Env, job_id: int, admin: dict[str, str]) -> list[dict]:  # type: ignore[type-arg]
    """The job's transition events (each `job.<status>` event but the first, which is its creation)."""
    events = env.client.get(f"/v1/jobs/{job_id}/events", headers=admin).json()
    return [e for e in events if "from" in e["data"] and "to" in e["data"]]


def test_each_transition_of_a_job_is_one_line_with_its_job_id(env: Env, admin: dict[str, str],
                                                             tmp_path: Path) -> None:
    job_id = env.client.post("/v1/jobs", json=one_process("print('hello')"), headers=admin).json()["id"]
    dispatcher = make_dispatcher(env, tmp_path)
    with captured_logs() as logs:
        job = drive(env, dispatcher, job_id, admin)
    assert job["status"] == "SUCCEEDED"
    lines = logs.records("shardctl.jobs", job_id=job_id)
    moves = [(e["data"]["from"], e["data"]["to"]) for e in status_events(env, job_id, admin)]
    assert [(line["from"], line["to"]) for line in lines] == moves  # one line per transition, in order
    assert moves[0] == ("QUEUED", "SUBMITTING") and moves[-1][1] == "SUCCEEDED"
    assert {line["actor"] for line in lines} == {dispatcher.actor}
    assert lines[0]["attempt"] == 1 and lines[-1]["exit_code"] == 0
    ours = ("leased", "submitted", "adopted", "released")
    decisions = [r["decision"] for r in logs.records("shardctl.dispatcher", job_id=job_id) if r.get("decision") in ours]
    assert decisions == ["leased", "submitted"]
    [submitted] = logs.records("shardctl.dispatcher", decision="submitted")
    assert submitted["backend"] == "local" and submitted["attempt"] == 1 and submitted["backend_id"]


def test_a_failure_is_a_warning_line_with_its_class_exit_code_and_reason(env: Env, admin: dict[str, str],
                                                                         tmp_path: Path) -> None:
    job_id = env.client.post("/v1/jobs", json=one_process("import sys; print('loss is nan'); sys.exit(3)"),
                             headers=admin).json()["id"]
    with captured_logs() as logs:
        job = drive(env, make_dispatcher(env, tmp_path), job_id, admin)
    assert job["status"] == "FAILED"
    failed = status_events(env, job_id, admin)[-1]
    [line] = logs.records("shardctl.jobs", job_id=job_id, to="FAILED")
    assert line["level"] == "WARNING" and line["exit_code"] == 3
    assert line["failure_class"] == failed["data"]["failure"] and line["failure_class"]
    assert line["reason"] == failed["message"]


def test_a_job_the_dispatcher_cannot_run_is_logged_as_it_fails(env: Env, admin: dict[str, str],
                                                               tmp_path: Path) -> None:
    """A backend this dispatcher lacks: leased, then SUBMITTING and FAILED in one transaction, two lines."""
    from tests.specs import tiny

    job_id = env.client.post("/v1/jobs", json=tiny(backend={"kind": "kubernetes"}), headers=admin).json()["id"]
    with captured_logs() as logs:
        drive(env, make_dispatcher(env, tmp_path), job_id, admin)
    assert [(r["from"], r["to"]) for r in logs.records("shardctl.jobs", job_id=job_id)] == [
        ("QUEUED", "SUBMITTING"), ("SUBMITTING", "FAILED")]
    assert "not configured" in logs.records("shardctl.jobs", job_id=job_id, to="FAILED")[0]["reason"]
    assert logs.records("shardctl.dispatcher", decision="leased", job_id=job_id)


def test_credentials_in_a_transitions_message_are_not_logged(env: Env, admin: dict[str, str]) -> None:
    """Backends' messages can quote what they were sent; logs are read more widely than the API."""
    from service.store.models import Job
    from service.store.states import transition
    from service.store.vocab import JobStatus
    from tests.specs import tiny

    job_id = env.client.post("/v1/jobs", json=tiny(), headers=admin).json()["id"]
    with captured_logs() as logs, env.app.state.sessions.begin() as session:
        transition(session, session.get(Job, job_id), JobStatus.CANCELLED, actor="test",
                   message="could not reach postgresql://trainer:hunter2@db.internal/runs")
    [line] = logs.records("shardctl.jobs", job_id=job_id)
    assert "hunter2" not in logs.text and "db.internal" in line["reason"]
