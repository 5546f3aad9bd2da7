"""Live event streams: streams run on the event loop and leave the worker
threads to the other endpoints, are capped per token and in all, end when their token stops
working, and a Last-Event-ID that is not an event id is a 400.

On the code before, each stream slept inside the 40-thread pool every handler shares (60 streams
pushed /whoami from 20 ms to 25 s), a revoked token's stream kept delivering, and
`Last-Event-ID: ²` or 5,000 digits was a 500.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack

import httpx
import pytest

from service.store.models import Job
from service.store.states import transition
from service.store.vocab import JobStatus
from tests.db_fixtures import Env
from tests.specs import tiny

STREAM = {"Accept": "text/event-stream"}
#: Generous: an answer that waits behind streams takes seconds (25 s in the report), not milliseconds.
ANSWER_WITHIN_S = 10.0  # a liveness bound, not a speed figure: 60 streams pushed /whoami to 25 s before


def _queued_job(env: Env, headers: dict[str, str]) -> int:
    r = env.client.post("/v1/jobs", json=tiny(), headers=headers)
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def _lines(response: httpx.Response, deadline_s: float) -> Iterator[str]:
    deadline = time.monotonic() + deadline_s
    for line in response.iter_lines():
        yield line
        if time.monotonic() > deadline:
            raise AssertionError(f"the stream was still open after {deadline_s} s")


def _wait_until(condition: object, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.05)


def test_sixty_live_streams_leave_the_other_endpoints_answering(env: Env, live: str) -> None:
    env.app.state.settings.events_poll_s = 0.5  # the default: each stream polls twice a second
    admin = env.headers(env.token("admin"))
    job_id = _queued_job(env, admin)  # QUEUED: no dispatcher runs here, so its stream never ends by itself
    watchers = [env.headers(env.token("admin", name=f"watcher-{i}")) for i in range(4)]
    with ExitStack() as stack:
        client = stack.enter_context(httpx.Client(base_url=live, timeout=30,
                                                  limits=httpx.Limits(max_connections=100)))
        streams = []
        for i in range(60):
            response = stack.enter_context(client.stream("GET", f"/v1/jobs/{job_id}/events",
                                                         headers={**watchers[i % 4], **STREAM}))
            assert response.status_code == 200, response.read()
            streams.append(response)
        assert env.app.state.streams.total == 60
        with httpx.Client(base_url=live, timeout=30) as other:
            for _ in range(3):
                for path, headers in (("/healthz", {}), ("/v1/whoami", admin), (f"/v1/jobs/{job_id}", admin),
                                      ("/v1/jobs", admin)):
                    started = time.monotonic()
                    r = other.get(path, headers=headers)
                    took = time.monotonic() - started
                    assert r.status_code == 200, (path, r.text[:200])
                    assert took < ANSWER_WITHIN_S, f"{path} took {took:.2f} s with 60 streams open"
        first = next(line for line in _lines(streams[-1], 10) if line.startswith("data: "))
        assert '"kind": "job.queued"' in first
    # every stream gave its slot back when its client went away
    _wait_until(lambda: env.app.state.streams.total == 0)


def test_a_revoked_tokens_stream_ends(env: Env, live: str) -> None:
    admin = env.headers(env.token("admin"))
    job_id = _queued_job(env, admin)
    member = env.token("member", team="default")
    token_id = member.split("_")[1]
    with httpx.Client(base_url=live, timeout=30) as client, \
            client.stream("GET", f"/v1/jobs/{job_id}/events", headers={**env.headers(member), **STREAM}) as r:
        assert r.status_code == 200
        lines = _lines(r, 15)
        assert next(line for line in lines if line.startswith("event: ")) == "event: job.queued"
        assert client.post(f"/v1/tokens/{token_id}/revoke", headers=admin).status_code == 200
        rest = list(lines)  # ends: the server closes the stream
    assert "event: error" in rest and any('"code": "unauthorized"' in line for line in rest), rest
    _wait_until(lambda: env.app.state.streams.total == 0)


def test_a_stream_ends_when_its_token_expires(env: Env, live: str) -> None:
    """A job token's stream of its own job ends once the token's expiry passes (as when its job ended)."""
    admin = env.headers(env.token("admin"))
    job_id = _queued_job(env, admin)
    from datetime import timedelta

    from service.store.models import ApiToken, utcnow

    job_token = env.token("job", job_id=job_id)
    with httpx.Client(base_url=live, timeout=30) as client, \
            client.stream("GET", f"/v1/jobs/{job_id}/events", headers={**env.headers(job_token), **STREAM}) as r:
        lines = _lines(r, 15)
        assert next(line for line in lines if line.startswith("event: ")) == "event: job.queued"
        with env.app.state.sessions.begin() as session:
            session.get(ApiToken, job_token.split("_")[1]).expires_at = utcnow() - timedelta(seconds=1)
        assert "event: error" in list(lines)


def test_streams_are_capped_per_token_and_in_all(env: Env, live: str) -> None:
    limits = env.app.state.settings
    limits.max_streams_per_token, limits.max_streams = 2, 3
    admin = env.headers(env.token("admin"))
    job_id = _queued_job(env, admin)
    a, b, c = (env.headers(env.token("admin", name=n)) for n in "abc")
    path = f"/v1/jobs/{job_id}/events"
    with httpx.Client(base_url=live, timeout=30, limits=httpx.Limits(max_connections=20)) as client:
        with ExitStack() as stack:
            for headers in (a, a):
                assert stack.enter_context(client.stream("GET", path, headers={**headers, **STREAM})).status_code == 200
            r = client.get(path, headers={**a, **STREAM})
            assert r.status_code == 429 and r.json()["error"]["code"] == "too_many_requests"
            assert "this token" in r.json()["error"]["message"] and r.headers["retry-after"]
            assert stack.enter_context(client.stream("GET", path, headers={**b, **STREAM})).status_code == 200
            r = client.get(path, headers={**c, **STREAM})
            assert r.status_code == 429 and "this server" in r.json()["error"]["message"]
            assert client.get(path, headers=c).status_code == 200  # the JSON history is not a stream
        _wait_until(lambda: env.app.state.streams.total == 0)
        with client.stream("GET", path, headers={**c, **STREAM}) as r:
            assert r.status_code == 200


def _finished_job(env: Env, admin: dict[str, str]) -> tuple[int, list[int]]:
    job_id = _queued_job(env, admin)
    with env.app.state.sessions.begin() as session:
        job = session.get(Job, job_id)
        for status in (JobStatus.SUBMITTING, JobStatus.PENDING, JobStatus.RUNNING, JobStatus.SUCCEEDED):
            transition(session, job, status, actor="test")
    ids = [e["id"] for e in env.client.get(f"/v1/jobs/{job_id}/events", headers=admin).json()]
    return job_id, ids


@pytest.mark.parametrize("value", ["²".encode("latin-1"), b"1" * 5000, str(10**30).encode(), b"-1", b"1e3",
                                   b"12 34", b"0x10", "١".encode()])
def test_a_last_event_id_that_is_not_an_event_id_is_a_400(env: Env, admin: dict[str, str], value: bytes) -> None:
    job_id, _ = _finished_job(env, admin)
    r = env.client.get(f"/v1/jobs/{job_id}/events", headers={**admin, **STREAM, "Last-Event-ID": value})
    assert r.status_code == 400, (value, r.status_code, r.text[:200])
    assert r.json()["error"]["code"] == "bad_request"


def test_a_last_event_id_resumes_the_stream_after_it(env: Env, admin: dict[str, str]) -> None:
    job_id, ids = _finished_job(env, admin)
    for last, expected in ((str(ids[2]), ids[3:]), ("9" * 18, []), ("0", ids), ("", ids)):
        with env.client.stream("GET", f"/v1/jobs/{job_id}/events",
                               headers={**admin, **STREAM, "Last-Event-ID": last}) as r:
            body = "".join(r.iter_text())
        sent = [int(line[4:]) for line in body.splitlines() if line.startswith("id: ")]
        assert sent == expected and body.rstrip().endswith("event: end\ndata: {}"), body
