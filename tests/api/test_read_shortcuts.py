"""The job reads through the request gate's shortcuts (`service.api.app.SHORTCUTS`: `GET /v1/jobs/{id}`
by `routers.jobs.job_shortcut`, the list by `jobs_shortcut`) and through their routes, on SQLite and
PostgreSQL: one token lookup on one connection, and the same answers either way."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from service.api.app import SHORTCUTS
from service.api.routers import jobs as jobs_router
from tests.connection_counts import counted
from tests.db_fixtures import Env, app_env
from tests.log_capture import captured_logs
from tests.specs import tiny

BEAT = {"kind": "heartbeat", "data": {"step": 3, "loss": 1.5}}


def _job(env: Env, headers: dict[str, str]) -> int:
    r = env.client.post("/v1/jobs", json=tiny(), headers=headers)
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def test_a_job_is_read_with_one_token_lookup_on_one_connection(env: Env, admin: dict[str, str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The token check and the job's reads share one connection (one thread hop), where the gate's
    dependency and the route would take one each; logged with the token's id and the route's template."""
    job_id = _job(env, admin)
    secret = env.token("member", team="default")
    with counted(env, monkeypatch) as counts, captured_logs() as logs:
        r = env.client.get(f"/v1/jobs/{job_id}", headers=env.headers(secret))
    assert r.status_code == 200, r.text
    assert counts == {"lookups": 1, "checkouts": 1}
    assert r.json()["id"] == job_id and r.json()["team"] == "default"
    [line] = logs.records("shardctl.access")
    assert (line["route"], line["status"], line["principal"]) == ("/v1/jobs/{job_id}", 200, secret.split("_", 2)[1])


def test_the_shortcut_and_the_route_answer_a_job_alike(env: Env, admin: dict[str, str]) -> None:
    """`/v1/jobs/0<id>` is the same job to `JobId`, but not a plain id to the shortcut: the route answers
    it. Both answers carry the same bytes and headers (the job, its attempts and its newest measurements)."""
    job_id = _job(env, admin)
    job_token = env.headers(env.token("job", job_id=job_id))
    assert env.client.post(f"/v1/jobs/{job_id}/measurements", json=BEAT, headers=job_token).status_code == 201
    for headers in (admin, job_token):
        short = env.client.get(f"/v1/jobs/{job_id}", headers=headers)
        routed = env.client.get(f"/v1/jobs/0{job_id}", headers=headers)
        assert short.status_code == routed.status_code == 200
        assert short.content == routed.content
        assert short.json()["measurements"]["heartbeat"]["data"] == BEAT["data"]
        assert {k: v for k, v in short.headers.items() if k != "x-request-id"} == \
            {k: v for k, v in routed.headers.items() if k != "x-request-id"}


def test_what_the_shortcut_declines_gets_the_routes_answer(env: Env, admin: dict[str, str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Another team's job and a missing one are the same 404 (nothing leaks), found with one token
    lookup; a bad or missing token is a 401 with `WWW-Authenticate`; an id `JobId` refuses is its 422."""
    theirs = _job(env, env.headers(env.token("member", team="beta")))
    mine = env.headers(env.token("member", team="alpha"))
    answers = []
    for job_id in (theirs, theirs + 1000):
        with counted(env, monkeypatch) as counts:
            r = env.client.get(f"/v1/jobs/{job_id}", headers=mine)
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", r.text
        assert counts["lookups"] == 1
        answers.append(r.json()["error"]["message"].replace(str(job_id), "N"))
    assert answers[0] == answers[1]
    for headers in ({"Authorization": "Bearer shc_0123456789abcdef_not-a-real-secret"}, {}):
        r = env.client.get(f"/v1/jobs/{theirs}", headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized", r.text
        assert r.headers["WWW-Authenticate"] == "Bearer"
    for path in ("/v1/jobs/0", f"/v1/jobs/{2**63}", "/v1/jobs/-1"):
        r = env.client.get(path, headers=admin)
        assert r.status_code == 422 and r.json()["error"]["fields"][0]["loc"] == "path.job_id", (path, r.text)


def _page(env: Env, headers: dict[str, str], query: str) -> tuple[int, bytes]:
    r = env.client.get(f"/v1/jobs?{query}", headers=headers)
    return r.status_code, r.content


def _route_page(env: Env, headers: dict[str, str], query: str, monkeypatch: pytest.MonkeyPatch) -> tuple[int, bytes]:
    """`_page` answered by the route: the list's shortcut taken out for the request."""
    with monkeypatch.context() as patch:
        patch.delitem(SHORTCUTS, ("GET", "/v1/jobs"))
        return _page(env, headers, query)


def test_the_list_is_one_connection_with_the_routes_answers_its_token_checked_in_the_pages_statement(
        env: Env, admin: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Each query below, and its next page, answered by the shortcut and by the route (the shortcut
    taken out): the same status and the same bytes. Once a token has been looked up, the page's own
    statement checks it (no lookup), except where that statement proves nothing of the token: an empty
    page, or a sort read in several statements (`finished`)."""
    member = env.headers(env.token("member", team="alpha"))
    ids = [_job(env, member) for _ in range(3)] + [_job(env, env.headers(env.token("member", team="beta")))]
    env.client.post(f"/v1/jobs/{ids[0]}/cancel", headers=member)
    queries = ["", "limit=2", "status=QUEUED&status=CANCELLED&limit=1", "team=alpha&sort=status&limit=2",
               "backend=local&sort=-gpus", f"name={tiny()['name']}&sort=submitted", "status=SUCCEEDED",
               "sort=finished&limit=2"]
    for headers in (member, admin):
        assert _page(env, headers, "limit=1")[0] == 200  # the token is known from here on, if not before
        for query in queries:
            with counted(env, monkeypatch) as counts:
                status, short = _page(env, headers, query)
            assert status == 200, short
            proven = json.loads(short)["items"] and "sort=finished" not in query
            assert counts == {"lookups": 0 if proven else 1, "checkouts": 1}, query
            assert _route_page(env, headers, query, monkeypatch) == (status, short), query
            cursor = json.loads(short)["next_cursor"]
            if cursor:
                later = f"{query}&cursor={cursor}"
                assert _page(env, headers, later)[0] == 200
                assert _page(env, headers, later) == _route_page(env, headers, later, monkeypatch), later
    seen = {item["id"] for item in json.loads(_page(env, member, "limit=50")[1])["items"]}
    assert seen == set(ids[:3])  # a member's list holds its team's jobs only, as the route's does


def test_a_list_query_the_shortcut_does_not_read_is_the_routes_to_answer(env: Env, admin: dict[str, str]) -> None:
    """A value the route refuses is its 422, naming the parameter, and so is a parameter that takes one
    value given twice; a leading zero is read by the route as it always was; a bad token is a 401."""
    _job(env, admin)
    for query, loc in (("status=running", "query.status.0"), ("limit=0", "query.limit"),
                       (f"limit={10**6}", "query.limit"), ("sort=color", "query.sort"),
                       ("team=Not_A_Label", "query.team"), ("cursor=***", "query.cursor"),
                       ("cursor=abc", "query.cursor"), ("backend=mainframe", "query.backend"),
                       (f"name={'x' * 201}", "query.name"), ("limit=5&limit=1", "query.limit")):
        r = env.client.get(f"/v1/jobs?{query}", headers=admin)
        assert r.status_code == 422, (query, r.text)
        assert r.json()["error"]["fields"][0]["loc"] == loc, (query, r.text)
    assert _page(env, admin, "limit=01") == _page(env, admin, "limit=1")
    r = env.client.get("/v1/jobs", headers={"Authorization": "Bearer shc_0123456789abcdef_not-a-real-secret"})
    assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer"


@pytest.mark.parametrize("threads", [1, 3])
def test_the_shortcuts_work_on_at_most_shortcut_threads_requests_at_once(
        db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, threads: int) -> None:
    """`Settings.shortcut_threads` bounds the shortcuts at work in a process; the others wait their
    turn. Twelve concurrent lists: `threads` of them meet inside the shortcut (a barrier of that many
    would break otherwise), and never more (each stays a while, so that more would have overlapped)."""
    lock, together = threading.Lock(), threading.Barrier(threads, timeout=20)
    running, most = 0, 0
    original = jobs_router._with_token

    def counted_work(*args: Any) -> Any:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        try:
            together.wait()
            time.sleep(0.05)
            return original(*args)
        finally:
            with lock:
                running -= 1

    monkeypatch.setattr(jobs_router, "_with_token", counted_work)
    with app_env(db_url, tmp_path, shortcut_threads=threads) as env, ThreadPoolExecutor(12) as pool:
        headers = env.headers(env.token("admin"))
        answers = list(pool.map(lambda _: env.client.get("/v1/jobs", headers=headers), range(12)))
    assert [a.status_code for a in answers] == [200] * 12
    assert most == threads


def test_a_submission_waiting_in_its_shortcut_does_not_hold_up_reads(
        db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Submissions take their turns apart from reads (a submission may wait seconds for a planning
    thread): with one place each, a submission held inside its shortcut leaves a list and a job's
    read to answer, and is answered once it goes on."""
    inside, go_on = threading.Event(), threading.Event()
    original = jobs_router._submit_with_token

    def held(*args: Any) -> Any:
        inside.set()
        assert go_on.wait(20)
        return original(*args)

    with app_env(db_url, tmp_path, shortcut_threads=1) as env, ThreadPoolExecutor(1) as pool:
        headers = env.headers(env.token("admin"))
        job = _job(env, headers)
        monkeypatch.setattr(jobs_router, "_submit_with_token", held)
        try:
            submitted = pool.submit(env.client.post, "/v1/jobs", json=tiny(), headers=headers)
            assert inside.wait(20)
            assert env.client.get("/v1/jobs", headers=headers).status_code == 200
            assert env.client.get(f"/v1/jobs/{job}", headers=headers).status_code == 200
            assert not submitted.done()
        finally:
            go_on.set()
        assert submitted.result(timeout=20).status_code == 201
