"""Logs and artifacts through the API, on the real local backend: jobs whose two ranks print
lines run end to end (dispatcher, torchrun, the run folder), and the API reads them back from the run
folder: whole, resumed from a cursor, followed live over Server-Sent Events and resumed with
Last-Event-ID, one rank only; visibility as `GET /v1/jobs/{id}`; a cap on live followers."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.joblogs import encode_cursor
from service.settings import Settings
from service.store.db import make_engine, make_sessionmaker
from tests.db_fixtures import Env, LiveServer
from tests.specs import tiny
from workers.backends.local import LocalBackend
from workers.backends.outputs import BackendOutputs
from workers.dispatch.context import DispatcherConfig
from workers.dispatcher import Dispatcher

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
TWO_RANKS = ("import os, sys\nr = os.environ['RANK']\n"
             "for i in range(3):\n    print(f'line {i} of rank {r}', flush=True)\n"
             "print(f'warning from rank {r}', file=sys.stderr, flush=True)\n")


@pytest.fixture
def logs_env(db_url: str, tmp_path: Path) -> Iterator[Env]:
    """The API with the local backend's outputs wired in, as `shardctl serve` does."""
    settings = Settings(database_url=db_url, data_dir=tmp_path, events_poll_s=0.05, logs_poll_s=0.05,
                        logs_heartbeat_s=0.2)
    engine = make_engine(db_url)
    app = create_app(settings, engine=engine, log_reader=BackendOutputs({"local": LocalBackend(tmp_path / "local")}))
    with TestClient(app) as client:
        yield Env(app=app, client=client, url=db_url)
    engine.dispose()


def dispatcher(env: Env, tmp_path: Path) -> Dispatcher:
    return Dispatcher(make_sessionmaker(make_engine(env.url)), {"local": LocalBackend(tmp_path / "local")},
                      DispatcherConfig(retry_backoff_s=0.1))


def submit(env: Env, headers: dict[str, str], code: str, **extra: Any) -> int:
    spec = tiny(entrypoint={"command": ["python", "-c", code]}, **extra)  # cpu, 2 processes on 1 node
    r = env.client.post("/v1/jobs", json=spec, headers=headers)
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def run_to_end(env: Env, tmp_path: Path, job_id: int, headers: dict[str, str], timeout: float = 120) -> str:
    d = dispatcher(env, tmp_path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        d.run_once()
        status = env.client.get(f"/v1/jobs/{job_id}", headers=headers).json()["status"]
        if status in TERMINAL:
            return str(status)
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} did not end")


def page(env: Env, job_id: int, headers: dict[str, str], **params: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    r = env.client.get(f"/v1/jobs/{job_id}/logs", params=params, headers=headers)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/x-ndjson")
    rows = [json.loads(line) for line in r.text.splitlines()]
    *lines, end = rows
    assert r.headers.get("shardctl-next-cursor") == end["next_cursor"]
    return lines, end


def program_lines(lines: list[dict[str, Any]], rank: int) -> list[str]:
    return [x["line"] for x in lines if x["rank"] == rank]


def test_two_ranks_read_whole_resumed_from_a_cursor_and_one_rank_only(logs_env: Env, tmp_path: Path) -> None:
    env = logs_env
    admin = env.headers(env.token("admin"))
    job_id = submit(env, admin, TWO_RANKS)
    assert run_to_end(env, tmp_path, job_id, admin) == "SUCCEEDED"

    lines, end = page(env, job_id, admin)
    assert end["finished"] is True and end["attempt"] == 1
    for rank in (0, 1):  # each rank's lines, in the order it printed them, without torchrun's prefix
        mine = program_lines(lines, rank)
        assert [x for x in mine if x.startswith("line")] == [f"line {i} of rank {rank}" for i in range(3)]
        assert f"warning from rank {rank}" in mine
    assert {x["stream"] for x in lines} == {"output"}  # the local node log keeps stdout and stderr together
    assert all(x["line"] for x in lines if x["rank"] is not None)

    # resume from any line's cursor: exactly what follows it
    rest, _ = page(env, job_id, admin, cursor=lines[2]["cursor"])
    assert rest == lines[3:]
    nothing, again = page(env, job_id, admin, cursor=end["next_cursor"])
    assert nothing == [] and again["finished"] is True and again["next_cursor"] == end["next_cursor"]
    # pages of two lines add up to the whole
    collected, cursor = [], None
    for _ in range(50):
        part, tail = page(env, job_id, admin, limit=2, **({"cursor": cursor} if cursor else {}))
        collected += part
        cursor = tail["next_cursor"]
        if not part:
            break
    assert collected == lines

    only, _ = page(env, job_id, admin, rank=1)
    assert only and {x["rank"] for x in only} == {1}
    assert [x["line"] for x in only] == program_lines(lines, 1)
    assert page(env, job_id, admin, attempt=1)[0] == lines
    assert env.client.get(f"/v1/jobs/{job_id}/logs", params={"attempt": 2}, headers=admin).status_code == 404


def sse_events(response: httpx.Response, until: str, deadline_s: float = 60) -> Iterator[dict[str, Any]]:
    """Each event as {"id", "event", "data"}, and heartbeats as {"comment"}, until an `until` event."""
    deadline = time.monotonic() + deadline_s
    event: dict[str, Any] = {}
    for raw in response.iter_lines():
        if time.monotonic() > deadline:
            raise AssertionError(f"no {until} event within {deadline_s} s")
        if raw.startswith(":"):
            yield {"comment": raw}
        elif raw.startswith("id: "):
            event["id"] = raw[4:]
        elif raw.startswith("event: "):
            event["event"] = raw[7:]
        elif raw.startswith("data: "):
            event["data"] = json.loads(raw[6:])
        elif raw == "" and event:
            yield event
            if event.get("event") == until:
                return
            event = {}


def test_follow_live_with_sse_and_resume_with_last_event_id(logs_env: Env, tmp_path: Path) -> None:
    env = logs_env
    admin = env.headers(env.token("admin"))
    code = ("import os, time\nr = os.environ['RANK']\nprint(f'before {r}', flush=True)\n"
            "while not os.path.exists('go'):\n    time.sleep(0.05)\nprint(f'after {r}', flush=True)\n")
    job_id = submit(env, admin, code)
    stop = threading.Event()
    d = dispatcher(env, tmp_path)

    def drive() -> None:
        while not stop.is_set():
            d.run_once()
            time.sleep(0.1)

    driver = threading.Thread(target=drive, daemon=True)
    driver.start()
    try:
        with LiveServer(env.app) as url, httpx.Client(base_url=url, headers=admin, timeout=60) as http:
            seen: list[dict[str, Any]] = []
            beats = 0
            with http.stream("GET", f"/v1/jobs/{job_id}/logs", params={"follow": "true"}) as r:
                assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
                for ev in sse_events(r, until="end"):
                    if "comment" in ev:
                        beats += 1
                    elif ev["event"] == "line":
                        assert ev["id"] == ev["data"]["cursor"]
                        seen.append(ev)
                    if {"before 0", "before 1"} <= {e["data"]["line"] for e in seen} and beats:
                        break  # both ranks printed while the job runs; the stream is live and idle-beating
            assert env.client.get(f"/v1/jobs/{job_id}", headers=admin).json()["status"] not in TERMINAL
            folder = tmp_path / "local" / f"shardctl-{job_id}-1" / "out"
            (folder / "go").write_text("")
            last = seen[-1]["id"]
            with http.stream("GET", f"/v1/jobs/{job_id}/logs", params={"follow": "true"},
                             headers={"Last-Event-ID": last}) as r:
                events = [ev for ev in sse_events(r, until="end") if "comment" not in ev]
        lines = [e["data"]["line"] for e in events if e["event"] == "line"]
        assert sorted(x for x in lines if x.startswith(("before", "after"))) == ["after 0", "after 1"]
        assert events[-1]["event"] == "end" and events[-1]["data"]["attempt"] == 1
        # the whole, read afterwards, is what the two follows saw together
        whole, end = page(env, job_id, admin)
        assert [x["line"] for x in whole] == [e["data"]["line"] for e in seen] + lines
        assert end["next_cursor"] == events[-1]["data"]["next_cursor"]
    finally:
        stop.set()
        driver.join(timeout=30)


def test_another_teams_job_is_not_found_and_a_bad_cursor_is_refused(logs_env: Env, tmp_path: Path) -> None:
    env = logs_env
    alpha, beta = env.headers(env.token("member", team="alpha")), env.headers(env.token("member", team="beta"))
    job_id = submit(env, alpha, TWO_RANKS)
    lines, end = page(env, job_id, alpha)  # queued: no attempt yet, nothing to read
    assert lines == [] and end == {"next_cursor": None, "finished": False, "attempt": None}
    for path in (f"/v1/jobs/{job_id}/logs", f"/v1/jobs/{job_id}/artifacts", f"/v1/jobs/{job_id}/artifacts/x"):
        r = env.client.get(path, headers=beta)
        assert r.status_code == 404, (path, r.text)
    r = env.client.get(f"/v1/jobs/{job_id}/logs", params={"follow": "true"}, headers=beta)
    assert r.status_code == 404
    assert run_to_end(env, tmp_path, job_id, alpha) == "SUCCEEDED"
    huge = "1." + encode_cursor({"node0": 10**30})  # a forged offset no file has: a 400, never a 500
    deep = "1." + base64.urlsafe_b64encode(b"[" * 1500 + b"]" * 1500).decode().rstrip("=")  # past the recursion limit
    for bad in ("1.!!", "nonsense", "1.bm90IGpzb24", "1.WzFd", huge, deep):  # not ours, not JSON, a list
        r = env.client.get(f"/v1/jobs/{job_id}/logs", params={"cursor": bad}, headers=alpha)
        assert r.status_code == 400 and "cursor" in r.json()["error"]["message"], (bad, r.text)
        r = env.client.get(f"/v1/jobs/{job_id}/logs", headers={**alpha, "Last-Event-ID": bad},
                           params={"follow": "true"})
        if bad == huge:  # well formed: the backend's read refuses it, as the stream's error event
            assert r.status_code == 200 and "event: error" in r.text and "bad_request" in r.text, r.text
        else:
            assert r.status_code == 400 and "cursor" in r.json()["error"]["message"], (bad, r.text)
    r = env.client.get(f"/v1/jobs/{job_id}/logs", params={"cursor": end["next_cursor"] or "1.", "attempt": 2},
                       headers=alpha)
    assert r.status_code == 400


def test_live_followers_are_capped(logs_env: Env) -> None:
    env = logs_env
    env.app.state.settings.max_log_followers = 1
    admin = env.headers(env.token("admin"))
    job_id = submit(env, admin, TWO_RANKS)  # no dispatcher: it stays queued, so its follower stays open
    with LiveServer(env.app) as url, httpx.Client(base_url=url, headers=admin, timeout=30) as http:
        with http.stream("GET", f"/v1/jobs/{job_id}/logs", params={"follow": "true"}) as first:
            assert first.status_code == 200
            second = http.get(f"/v1/jobs/{job_id}/logs", params={"follow": "true"})
            assert second.status_code == 429 and "SHARDCTL_MAX_LOG_FOLLOWERS" in second.json()["error"]["message"]
            assert http.get(f"/v1/jobs/{job_id}/logs").status_code == 200  # pages are not capped
        deadline = time.monotonic() + 10
        while env.app.state.log_followers.open and time.monotonic() < deadline:
            time.sleep(0.05)
        with http.stream("GET", f"/v1/jobs/{job_id}/logs", params={"follow": "true"}) as again:
            assert again.status_code == 200  # the first one's slot came back when it closed


def test_artifacts_are_listed_and_small_ones_downloaded(logs_env: Env, tmp_path: Path) -> None:
    env = logs_env
    admin = env.headers(env.token("admin"))
    code = ("import os, json\nr = os.environ['RANK']\nos.makedirs('ckpt', exist_ok=True)\n"
            "open(f'ckpt/rank{r}.pt', 'wb').write(b'x' * 1000)\n"
            "if r == '0':\n    json.dump({'loss': 1.5}, open('report.json', 'w'))\n")
    job_id = submit(env, admin, code)
    assert run_to_end(env, tmp_path, job_id, admin) == "SUCCEEDED"
    r = env.client.get(f"/v1/jobs/{job_id}/artifacts", headers=admin)
    assert r.status_code == 200, r.text
    listing = r.json()
    assert listing["attempt"] == 1
    sizes = {a["path"]: a["size"] for a in listing["artifacts"]}
    assert sizes == {"ckpt/rank0.pt": 1000, "ckpt/rank1.pt": 1000, "report.json": len('{"loss": 1.5}')}
    assert all(a["modified"] for a in listing["artifacts"])

    r = env.client.get(f"/v1/jobs/{job_id}/artifacts/report.json", headers=admin)
    assert r.status_code == 200 and r.json() == {"loss": 1.5}
    assert env.client.get(f"/v1/jobs/{job_id}/artifacts/ckpt/rank1.pt", headers=admin).content == b"x" * 1000
    missing = env.client.get(f"/v1/jobs/{job_id}/artifacts/nothing.txt", headers=admin)
    assert missing.status_code == 404
    # the attempt folder holds the job token (request.json): nothing outside out/ is served
    for escape in ("%2E%2E/request.json", "ckpt/%2E%2E/%2E%2E/request.json", "%2Fetc%2Fpasswd"):
        r = env.client.get(f"/v1/jobs/{job_id}/artifacts/{escape}", headers=admin)
        assert r.status_code in (400, 404) and "token" not in r.text, (escape, r.text)
        assert r.json()["error"]["code"] in ("bad_request", "not_found")
    (tmp_path / "local" / f"shardctl-{job_id}-1" / "out" / "link").symlink_to("../request.json")
    r = env.client.get(f"/v1/jobs/{job_id}/artifacts/link", headers=admin)
    assert r.status_code == 400 and "outside" in r.json()["error"]["message"]
    env.app.state.settings.max_artifact_bytes = 999
    r = env.client.get(f"/v1/jobs/{job_id}/artifacts/ckpt/rank0.pt", headers=admin)
    assert r.status_code == 409 and "1000 bytes" in r.json()["error"]["message"]


def test_without_a_log_reader_the_routes_say_so(env: Env, admin: dict[str, str]) -> None:
    job_id = submit(env, admin, "print(1)")
    for path in (f"/v1/jobs/{job_id}/logs", f"/v1/jobs/{job_id}/artifacts"):
        r = env.client.get(path, headers=admin)
        assert r.status_code == 409 and r.json()["error"]["code"] == "not_available", r.text


def test_a_revoked_tokens_follow_ends_and_gives_its_slot_back(logs_env: Env) -> None:
    env = logs_env
    admin = env.headers(env.token("admin"))
    member = env.token("member", team="alpha")
    job_id = submit(env, env.headers(member), TWO_RANKS)  # queued: the follower waits for an attempt
    with LiveServer(env.app) as url, httpx.Client(base_url=url, timeout=30) as http:
        with http.stream("GET", f"/v1/jobs/{job_id}/logs", params={"follow": "true"},
                         headers=env.headers(member)) as r:
            events = sse_events(r, until="error", deadline_s=20)
            assert "comment" in next(events)  # a heartbeat: the stream is open and idle
            assert http.post(f"/v1/tokens/{member.split('_')[1]}/revoke", headers=admin).status_code == 200
            last = [e for e in events if "comment" not in e][-1]
        assert last["event"] == "error" and last["data"]["error"]["code"] == "unauthorized"
    deadline = time.monotonic() + 10
    while env.app.state.log_followers.open and time.monotonic() < deadline:
        time.sleep(0.05)
    assert env.app.state.log_followers.open == 0


def test_a_single_process_jobs_output_is_rank_0(logs_env: Env, tmp_path: Path) -> None:
    env = logs_env
    admin = env.headers(env.token("admin"))
    code = "import sys\nprint('alone')\nprint('oops', file=sys.stderr)\nprint('no newline', end='')"
    job_id = submit(env, admin, code, resources={"gpus_per_node": 1})  # one process: no torchrun, so no rank prefix
    assert run_to_end(env, tmp_path, job_id, admin) == "SUCCEEDED"
    lines, end = page(env, job_id, admin)
    assert [(x["rank"], x["line"]) for x in lines] == [(0, "alone"), (0, "oops"), (0, "no newline")]
    assert end["finished"] is True
