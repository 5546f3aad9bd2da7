"""Submissions through the request gate's shortcut (`service.api.app.SHORTCUTS`: `POST /v1/jobs` by
`routers.jobs.create_job_shortcut`) and through their route, on SQLite and PostgreSQL: one thread hop
and one token lookup, the same answers either way, and nothing stored twice when the shortcut leaves
a submission to the route."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio.to_thread
import pytest

from tests.connection_counts import counted
from tests.db_fixtures import Env
from tests.log_capture import captured_logs
from tests.specs import tiny

#: What differs between two submissions of one spec: the job's identity and time of creation.
PER_JOB = ("id", "name", "created_at", "updated_at")


@contextmanager
def thread_hops(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """While open: the name of each function the app runs in a worker thread (every hop goes through
    `anyio.to_thread.run_sync`: the gate's, the shortcuts', and Starlette's for a sync route)."""
    hops: list[str] = []
    real = anyio.to_thread.run_sync

    async def hop(func: Any, *args: Any, **kw: Any) -> Any:
        hops.append(getattr(func, "func", func).__name__)  # Starlette hands a functools.partial
        return await real(func, *args, **kw)

    monkeypatch.setattr(anyio.to_thread, "run_sync", hop)
    try:
        yield hops
    finally:
        monkeypatch.setattr(anyio.to_thread, "run_sync", real)


def _chunked(spec: dict[str, Any]) -> Iterator[bytes]:
    """The body without a Content-Length: the shortcut leaves it to the route."""
    return iter([json.dumps(spec).encode()])


def _jobs(env: Env, admin: dict[str, str]) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = env.client.get("/v1/jobs", headers=admin).json()["items"]
    return items


def test_a_submission_is_one_thread_hop_and_one_token_lookup(env: Env, admin: dict[str, str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The token check and the submission share one worker thread, where the gate's check and the
    route take one each; logged with the route's template and the token's id, and counted in the
    submissions metric as the route counts it."""
    secret = env.token("member", team="alpha")
    with thread_hops(monkeypatch) as hops, counted(env, monkeypatch) as counts, captured_logs() as logs:
        r = env.client.post("/v1/jobs", json=tiny(), headers=env.headers(secret))
    assert r.status_code == 201, r.text
    assert hops == ["_submit_with_token"]
    assert counts["lookups"] == 1
    assert r.json()["team"] == "alpha" and r.json()["status"] == "QUEUED"
    [line] = logs.records("shardctl.access")
    assert (line["route"], line["status"], line["principal"]) == ("/v1/jobs", 201, secret.split("_", 2)[1])
    with thread_hops(monkeypatch) as hops:
        routed = env.client.post("/v1/jobs", content=_chunked(tiny()),
                                 headers={**env.headers(secret), "Content-Type": "application/json"})
    assert routed.status_code == 201, routed.text
    assert hops == ["token_principal", "_run_sync_endpoint"]  # the route: two hops
    text = env.client.get("/metrics").text
    assert "shardctl_job_submissions_total 2.0" in text
    assert 'shardctl_http_request_duration_seconds_count{method="POST",route="/v1/jobs",status="201"} 2.0' in text


def test_the_shortcut_and_the_route_answer_a_submission_alike(env: Env, admin: dict[str, str]) -> None:
    """A 201 from each carries the same job but for its identity; an `Idempotency-Key` replay (200)
    is the same bytes and headers from either, and a key reused with another body the same 409."""
    member = env.headers(env.token("member", team="alpha"))
    json_type = {"Content-Type": "application/json"}
    short = env.client.post("/v1/jobs", json=tiny(), headers={**member, "Idempotency-Key": "k1"})
    routed = env.client.post("/v1/jobs", content=_chunked(tiny()), headers={**member, **json_type})
    assert short.status_code == routed.status_code == 201, (short.text, routed.text)
    assert {k: v for k, v in short.json().items() if k not in PER_JOB} == \
        {k: v for k, v in routed.json().items() if k not in PER_JOB}
    assert short.headers["content-type"] == routed.headers["content-type"] == "application/json"

    replays = [env.client.post("/v1/jobs", json=tiny(), headers={**member, "Idempotency-Key": "k1"}),
               env.client.post("/v1/jobs", content=_chunked(tiny()),
                               headers={**member, **json_type, "Idempotency-Key": "k1"})]
    for replay in replays:
        assert replay.status_code == 200, replay.text
        assert replay.json()["id"] == short.json()["id"]
    assert replays[0].content == replays[1].content
    assert {k: v for k, v in replays[0].headers.items() if k != "x-request-id"} == \
        {k: v for k, v in replays[1].headers.items() if k != "x-request-id"}

    other = tiny(training={"steps": 7})
    conflicts = [env.client.post("/v1/jobs", json=other, headers={**member, "Idempotency-Key": "k1"}),
                 env.client.post("/v1/jobs", content=_chunked(other),
                                 headers={**member, **json_type, "Idempotency-Key": "k1"})]
    assert [c.status_code for c in conflicts] == [409, 409]
    assert conflicts[0].content == conflicts[1].content
    assert len(_jobs(env, admin)) == 2


def test_what_the_shortcut_declines_gets_the_routes_answer_and_is_stored_once(
        env: Env, admin: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Each refusal is the route's answer, with the token looked up once, and nothing is stored: a job
    token (403), a priority over the team's limit (403 naming it), a spec its model refuses (422
    naming each field), one no layout fits (422 with the reasons). A bad token is a 401 whatever the
    body, with `WWW-Authenticate`."""
    assert env.client.put("/v1/pools/local", json={"backend": "local", "gpu": "cpu", "gpus": 2},
                          headers=admin).status_code in (200, 201)
    assert env.client.put("/v1/teams/alpha/quota", json={"max_priority": 10, "flavors": {"cpu": {"nominal": 1}}},
                          headers=admin).status_code == 200
    member = env.headers(env.token("member", team="alpha"))
    first = env.client.post("/v1/jobs", json=tiny(), headers=member)
    assert first.status_code == 201, first.text
    job_token = env.headers(env.token("job", job_id=first.json()["id"]))
    refused = [
        (job_token, tiny(), 403, "forbidden", "job token"),
        (member, tiny(priority=50), 403, "priority_over_limit", "limit of 10"),
        (member, tiny(training={"global_batch": -1, "precision": "int4"}), 422, "invalid_spec", "training."),
        (member, tiny(model={"preset": "llama-3.1-405b"}, resources={"gpu": "H100-SXM-80GB", "gpus_per_node": 8}),
         422, "does_not_fit", "fit"),
        (member, tiny(resources={"gpu": "H900"}), 422, "invalid_spec", "resources.gpu"),
    ]
    for headers, spec, status, code, said in refused:
        with counted(env, monkeypatch) as counts:
            r = env.client.post("/v1/jobs", json=spec, headers=headers)
        assert (r.status_code, r.json()["error"]["code"]) == (status, code), r.text
        assert said in r.text, r.text
        assert counts["lookups"] == 1, spec
        routed = env.client.post("/v1/jobs", content=_chunked(spec),
                                 headers={**headers, "Content-Type": "application/json"})
        assert routed.content == r.content
    for body in (tiny(), {"name": 3}, None):
        r = env.client.post("/v1/jobs", json=body, headers={"Authorization": "Bearer shc_0123456789abcdef_nope"})
        assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer", r.text
    assert [job["id"] for job in _jobs(env, admin)] == [first.json()["id"]]
    assert "shardctl_job_submissions_total 1.0" in env.client.get("/metrics").text
