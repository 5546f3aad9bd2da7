"""Profile summaries through the API: posted by the runtime, or analysed from uploaded traces."""

from __future__ import annotations

import time

import pytest

from service.profiles import analyze_traces
from tests.db_fixtures import Env
from tests.specs import tiny
from tests.support.traces import GLOO


def _job(env: Env, team: str = "alpha") -> tuple[int, dict[str, str]]:
    member = env.headers(env.token("member", team=team))
    return env.client.post("/v1/jobs", json=tiny(), headers=member).json()["id"], member


def test_the_runtimes_summary_is_stored_and_listed(env: Env) -> None:
    job_id, member = _job(env)
    job_token = env.headers(env.token("job", job_id=job_id))
    summary = analyze_traces(GLOO).model_dump(mode="json")
    r = env.client.post(f"/v1/jobs/{job_id}/profiles", json=summary, headers=job_token)
    assert r.status_code == 201
    listed = env.client.get(f"/v1/jobs/{job_id}/profiles", headers=member).json()
    assert [p["summary"]["diagnosis"]["bound"] for p in listed] == ["input"]
    assert env.client.post(f"/v1/jobs/{job_id}/profiles", json=summary, headers=member).status_code == 403
    other = env.headers(env.token("member", team="beta"))
    assert env.client.get(f"/v1/jobs/{job_id}/profiles", headers=other).status_code == 404


def test_a_summary_that_breaks_the_contract_is_422(env: Env) -> None:
    job_id, _ = _job(env)
    job_token = env.headers(env.token("job", job_id=job_id))
    r = env.client.post(f"/v1/jobs/{job_id}/profiles", json={"ranks": "nope"}, headers=job_token)
    assert r.status_code == 422 and r.json()["error"]["fields"]


def _wait_for(env: Env, job_id: int, admin: dict[str, str], kind: str) -> list[dict]:  # type: ignore[type-arg]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        events = env.client.get(f"/v1/jobs/{job_id}/events", headers=admin).json()
        if any(e["kind"] == kind for e in events):
            return events  # type: ignore[no-any-return]
        time.sleep(0.2)
    raise AssertionError(f"no {kind} event")


def test_uploaded_traces_are_analysed_in_the_background(env: Env, admin: dict[str, str]) -> None:
    job_id, member = _job(env)
    files = [("files", (p.name, p.read_bytes(), "application/gzip")) for p in GLOO]
    r = env.client.post(f"/v1/jobs/{job_id}/profiles/traces", files=files, headers=admin)
    assert r.status_code == 202 and r.json()["files"] == 2
    _wait_for(env, job_id, admin, "job.profile")
    (profile,) = env.client.get(f"/v1/jobs/{job_id}/profiles", headers=member).json()
    assert profile["summary"]["ranks_present"] == [0, 1]
    assert profile["summary"]["diagnosis"]["bound"] == "input"
    # The verdict is set against the job's own plan: its predicted exposed-communication share.
    time = env.client.get(f"/v1/jobs/{job_id}", headers=member).json()["plan"]["time"]
    comparison = profile["summary"]["diagnosis"]["plan"]
    assert comparison["predicted_comm_fraction"] == pytest.approx(time["comm_exposed_s"] / time["step_s"])
    assert "plan's predicted" in comparison["text"]


def test_a_broken_trace_is_reported_as_an_event(env: Env, admin: dict[str, str]) -> None:
    job_id, _ = _job(env)
    r = env.client.post(f"/v1/jobs/{job_id}/profiles/traces", headers=admin,
                        files=[("files", ("rank-0.json.gz", b"\x1f\x8b\x08\x00truncated", "application/gzip"))])
    assert r.status_code == 202
    failed = [e for e in _wait_for(env, job_id, admin, "job.profile_failed") if e["kind"] == "job.profile_failed"]
    assert "gzip" in failed[0]["message"].lower() or "truncated" in failed[0]["message"].lower()
    assert env.client.get(f"/v1/jobs/{job_id}/profiles", headers=admin).json() == []


def test_a_trace_over_the_size_limit_is_413_and_leaves_nothing(env: Env, admin: dict[str, str]) -> None:
    job_id, _ = _job(env)
    settings = env.app.state.settings
    settings.max_trace_bytes = 4096
    big = [("files", ("rank-0.json", b" " * 10_000, "application/json"))]
    r = env.client.post(f"/v1/jobs/{job_id}/profiles/traces", files=big, headers=admin)
    assert r.status_code == 413
    message = r.json()["error"]["message"]
    assert "rank-0.json" in message and "4096" in message and "gzip" in message
    assert not list((settings.data_dir / "profiles" / str(job_id)).glob("*/*"))
    events = env.client.get(f"/v1/jobs/{job_id}/events", headers=admin).json()
    assert not [e for e in events if e["kind"].startswith("job.profile")]


def test_trace_files_posted_to_profiles_itself_are_analysed_too(env: Env, admin: dict[str, str]) -> None:
    job_id, member = _job(env)
    files = [("files", (p.name, p.read_bytes(), "application/gzip")) for p in GLOO]
    r = env.client.post(f"/v1/jobs/{job_id}/profiles", files=files, headers=admin)
    assert r.status_code == 202, r.text
    assert r.json()["files"] == 2, r.text
    _wait_for(env, job_id, admin, "job.profile")
    (profile,) = env.client.get(f"/v1/jobs/{job_id}/profiles", headers=member).json()
    assert profile["summary"]["ranks_present"] == [0, 1]
    # A member may read profiles but not post them, whichever form the body takes.
    assert env.client.post(f"/v1/jobs/{job_id}/profiles", files=files, headers=member).status_code == 403


def test_a_job_whose_plan_cannot_be_read_still_gets_its_profile(env: Env, admin: dict[str, str]) -> None:
    from sqlalchemy import text

    job_id, member = _job(env)
    with env.app.state.sessions.begin() as session:  # as a row an older shardctl wrote, past the typed column
        session.execute(text("UPDATE jobs SET plan = :plan WHERE id = :id"),
                        {"plan": '{"written by": "an older shardctl"}', "id": job_id})
    files = [("files", (p.name, p.read_bytes(), "application/gzip")) for p in GLOO]
    assert env.client.post(f"/v1/jobs/{job_id}/profiles/traces", files=files, headers=admin).status_code == 202
    _wait_for(env, job_id, admin, "job.profile")
    (profile,) = env.client.get(f"/v1/jobs/{job_id}/profiles", headers=member).json()
    assert profile["summary"]["diagnosis"]["bound"] == "input" and profile["summary"]["diagnosis"]["plan"] is None
    assert not list((env.app.state.settings.data_dir / "profiles" / str(job_id)).glob("*/*"))


def _set_status(env: Env, job_id: int, status: str) -> None:
    from service.store.models import Job
    from service.store.vocab import JobStatus

    with env.app.state.sessions.begin() as session:
        session.get(Job, job_id).status = JobStatus(status)


def test_a_job_token_uploads_traces_only_while_its_job_runs(env: Env, admin: dict[str, str]) -> None:
    job_id, _ = _job(env)
    job_token = env.headers(env.token("job", job_id=job_id))
    files = [("files", (p.name, p.read_bytes(), "application/gzip")) for p in GLOO]
    r = env.client.post(f"/v1/jobs/{job_id}/profiles/traces", files=files, headers=job_token)
    assert r.status_code == 409 and "while its job runs" in r.json()["error"]["message"]  # still QUEUED
    _set_status(env, job_id, "RUNNING")
    assert env.client.post(f"/v1/jobs/{job_id}/profiles/traces", files=files, headers=job_token).status_code == 202
    _wait_for(env, job_id, admin, "job.profile")
    _set_status(env, job_id, "SUCCEEDED")
    assert env.client.post(f"/v1/jobs/{job_id}/profiles/traces", files=files, headers=job_token).status_code == 409
    assert env.client.post(f"/v1/jobs/{job_id}/profiles/traces", files=files, headers=admin).status_code == 202


def test_a_job_holds_a_bounded_number_of_profiles(env: Env, admin: dict[str, str]) -> None:
    env.app.state.settings.max_profiles_per_job = 2
    job_id, _ = _job(env)
    summary = analyze_traces(GLOO).model_dump(mode="json")
    codes = [env.client.post(f"/v1/jobs/{job_id}/profiles", json=summary, headers=admin).status_code
             for _ in range(3)]
    assert codes == [201, 201, 409]
    files = [("files", (p.name, p.read_bytes(), "application/gzip")) for p in GLOO]
    r = env.client.post(f"/v1/jobs/{job_id}/profiles/traces", files=files, headers=admin)
    assert r.status_code == 409 and "SHARDCTL_MAX_PROFILES_PER_JOB" in r.json()["error"]["message"]
    assert len(env.client.get(f"/v1/jobs/{job_id}/profiles", headers=admin).json()) == 2


def test_uploads_beyond_the_analysis_queue_are_a_503_and_leave_nothing(env: Env, admin: dict[str, str]) -> None:
    import threading

    from service.api.analysis import AnalysisPool

    release = threading.Event()
    pool = AnalysisPool(workers=1, queue=1)
    pool.submit(release.wait)  # the worker is busy
    pool.submit(release.wait)  # and the one queue place is taken
    env.app.state.analyses = pool
    job_id, _ = _job(env)
    files = [("files", (p.name, p.read_bytes(), "application/gzip")) for p in GLOO]
    try:
        r = env.client.post(f"/v1/jobs/{job_id}/profiles/traces", files=files, headers=admin)
        assert r.status_code == 503 and r.headers["Retry-After"] == "60"
        assert r.json()["error"]["code"] == "analysis_busy"
        assert not list((env.app.state.settings.data_dir / "profiles" / str(job_id)).glob("*/*"))
    finally:
        release.set()
        pool.shutdown()


def test_uploaded_traces_are_private_and_a_failure_names_no_server_folder(env: Env, admin: dict[str, str],
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import stat

    job_id, member = _job(env)
    data_dir = env.app.state.settings.data_dir
    held: list[object] = []
    monkeypatch.setattr(env.app.state.analyses, "submit", held.append)  # hold the analysis back to look
    files = [("files", ("rank-0.json.gz", b"\x1f\x8b\x08\x00truncated", "application/gzip"))]
    assert env.client.post(f"/v1/jobs/{job_id}/profiles/traces", files=files, headers=admin).status_code == 202
    [trace] = (data_dir / "profiles").rglob("trace-0.json.gz")
    assert stat.S_IMODE(trace.stat().st_mode) == 0o600
    for folder in (trace.parent, trace.parent.parent, trace.parent.parent.parent):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    held[0]()  # type: ignore[operator]
    failed = [e for e in env.client.get(f"/v1/jobs/{job_id}/events", headers=member).json()
              if e["kind"] == "job.profile_failed"]
    assert failed and str(data_dir) not in failed[0]["message"], failed
