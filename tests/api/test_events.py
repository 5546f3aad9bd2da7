"""The event feed on both databases: `GET /v1/events` after a cursor, filtered by team, job and type
(exact or prefix), scoped to the caller's team; its live stream resumes after `Last-Event-ID`."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx

from tests.db_fixtures import Env
from tests.specs import tiny


def _submit(env: Env, headers: dict[str, str], name: str) -> int:
    r = env.client.post("/v1/jobs", json=tiny(name=name), headers=headers)
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def _feed(env: Env, headers: dict[str, str], **params: object) -> list[tuple[int, str, int]]:
    r = env.client.get("/v1/events", params=params, headers=headers)
    assert r.status_code == 200, r.text
    return [(e["id"], e["kind"], e["job_id"]) for e in r.json()["items"]]


def _two_teams(env: Env) -> tuple[dict[str, str], dict[str, str], int, int]:
    alpha = env.headers(env.token("member", team="alpha"))
    beta = env.headers(env.token("member", team="beta"))
    a = _submit(env, alpha, "a")
    b = _submit(env, beta, "b")
    assert env.client.post(f"/v1/jobs/{a}/cancel", headers=alpha).status_code == 200
    return alpha, beta, a, b


def test_the_feed_filters_by_team_job_and_type(env: Env, admin: dict[str, str]) -> None:
    _, _, a, b = _two_teams(env)
    everything = _feed(env, admin)
    assert [(k, j) for _, k, j in everything] == [("job.queued", a), ("job.queued", b), ("job.cancelled", a)]
    assert [i for i, _, _ in everything] == sorted(i for i, _, _ in everything)
    assert [j for _, _, j in _feed(env, admin, team="beta")] == [b]
    assert [k for _, k, _ in _feed(env, admin, job=a)] == ["job.queued", "job.cancelled"]
    assert [j for _, _, j in _feed(env, admin, type="job.cancelled")] == [a]
    assert len(_feed(env, admin, type="job.")) == 3 and len(_feed(env, admin, type="job.*")) == 3
    assert _feed(env, admin, type="job") == []  # not a prefix without its dot: an exact type


def test_a_member_sees_only_its_teams_events(env: Env, admin: dict[str, str]) -> None:
    alpha, beta, a, b = _two_teams(env)
    assert {j for _, _, j in _feed(env, alpha)} == {a}
    assert [j for _, _, j in _feed(env, beta)] == [b]
    assert _feed(env, beta, team="alpha") == [] and _feed(env, beta, job=a) == []


def test_the_cursor_reads_on_from_where_the_last_page_ended(env: Env, admin: dict[str, str]) -> None:
    _two_teams(env)
    first = env.client.get("/v1/events", params={"limit": 2}, headers=admin).json()
    assert len(first["items"]) == 2 and first["next_cursor"] == str(first["items"][-1]["id"])
    rest = env.client.get("/v1/events", params={"since": first["next_cursor"]}, headers=admin).json()
    assert [e["kind"] for e in rest["items"]] == ["job.cancelled"]
    end = env.client.get("/v1/events", params={"since": rest["next_cursor"]}, headers=admin).json()
    assert end == {"items": [], "next_cursor": rest["next_cursor"]}


def _messages(response: httpx.Response, deadline_s: float = 15.0) -> Iterator[dict[str, object]]:
    deadline, message = time.monotonic() + deadline_s, {}
    for line in response.iter_lines():
        if time.monotonic() > deadline:
            raise AssertionError(f"no more messages within {deadline_s} s")
        if line == "":
            if message:
                yield message
            message = {}
        elif not line.startswith(":"):
            key, _, value = line.partition(": ")
            message[key] = json.loads(value) if key == "data" else value


def test_the_stream_resumes_after_last_event_id_and_follows_live(env: Env, live: str) -> None:
    admin = env.headers(env.token("admin"))
    alpha, _, _, _ = _two_teams(env)
    ids = [i for i, _, _ in _feed(env, admin)]
    with httpx.Client(base_url=live, timeout=30) as client, \
            client.stream("GET", "/v1/events/stream", headers={**admin, "Last-Event-ID": str(ids[0])}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        messages = _messages(r)
        resumed = [next(messages), next(messages)]
        assert [int(str(m["id"])) for m in resumed] == ids[1:]
        assert [m["event"] for m in resumed] == ["job.queued", "job.cancelled"]
        new_job = _submit(env, alpha, "later")
        live_one = next(messages)
        assert live_one["event"] == "job.queued" and live_one["data"]["job_id"] == new_job  # type: ignore[index]
        assert int(str(live_one["id"])) > ids[-1]


def test_a_members_stream_holds_only_its_teams_events(env: Env, live: str) -> None:
    alpha, beta, _, b = _two_teams(env)
    with httpx.Client(base_url=live, timeout=30) as client, \
            client.stream("GET", "/v1/events", params={"type": "job."},
                          headers={**beta, "Accept": "text/event-stream"}) as r:
        messages = _messages(r)
        assert next(messages)["data"]["job_id"] == b  # type: ignore[index]
        _submit(env, alpha, "not-for-beta")
        later = _submit(env, beta, "for-beta")
        assert next(messages)["data"]["job_id"] == later  # type: ignore[index]


def test_a_malformed_last_event_id_is_a_400(env: Env, admin: dict[str, str]) -> None:
    r = env.client.get("/v1/events/stream", headers={**admin, "Last-Event-ID": "12x"})
    assert r.status_code == 400 and "Last-Event-ID" in r.json()["error"]["message"]
