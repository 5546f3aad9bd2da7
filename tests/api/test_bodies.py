"""Request bodies: what can be stored can be read back, bodies are
limited as they arrive and only read after the token is checked, and a body that is not JSON says so.

Each test here failed on the code before the request gate (`service.api.app.RequestGate`): a lone
surrogate or NaN was stored and broke every later read of the job, a chunked body had no limit, an
anonymous 256 MiB body was read whole before its 401, malformed JSON was a 422 with `loc: "13"`.
"""

from __future__ import annotations

import json
import select
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from service.api.deps import MAX_JSON_DEPTH
from service.profiles import analyze_traces
from tests.db_fixtures import Env
from tests.specs import tiny

GLOO = sorted((Path(__file__).parents[1] / "profiles" / "fixtures" / "gloo_ddp").glob("rank-*.json.gz"))
JSON = {"Content-Type": "application/json"}


def _nested(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for _ in range(depth - 1):
        value = {"a": value}
    return value


def _deep(depth: int, leaf: bytes = b"1") -> bytes:
    """`depth` levels of {"a": ...} around `leaf`, as bytes (json.dumps cannot write that deep)."""
    return b'{"a": ' * (depth - 1) + leaf + b"}" * (depth - 1)


def _raw(value: Any) -> bytes:
    """JSON as a client may send it: NaN and lone surrogates escaped (\\udc80), deep nesting at any depth."""
    return json.dumps(value, allow_nan=True).encode()


def _job(env: Env, headers: dict[str, str]) -> int:
    r = env.client.post("/v1/jobs", json=tiny(), headers=headers)
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def _everything_still_reads(env: Env, admin: dict[str, str], job_id: int) -> None:
    assert env.client.get("/v1/jobs", headers=admin).status_code == 200
    assert env.client.get(f"/v1/jobs/{job_id}", headers=admin).status_code == 200
    assert env.client.get(f"/v1/jobs/{job_id}/events", headers=admin).status_code == 200
    assert env.client.get(f"/v1/jobs/{job_id}/profiles", headers=admin).status_code == 200
    assert env.client.post(f"/v1/jobs/{job_id}/cancel", headers=admin).status_code == 200


SPECS_NO_DATABASE_CAN_KEEP = {
    "surrogate in entrypoint.env": (tiny(entrypoint={"command": ["python", "train.py"], "env": {"X": "\udc80"}}),
                                    "entrypoint.env.X"),
    "surrogate in backend.sbatch": (tiny(backend={"kind": "slurm", "sbatch": ["--comment=\ud800"]}),
                                    "backend.sbatch.0"),
    "surrogate in a key": (tiny(entrypoint={"command": ["x"], "env": {"\udfff": "1"}}), "entrypoint.env.\\udfff"),
    "NUL 5000 levels deep": (tiny(entrypoint={"command": ["x"], "env": {"X": "@"}}), None),
}


@pytest.mark.parametrize("case", sorted(SPECS_NO_DATABASE_CAN_KEEP))
def test_a_spec_no_database_can_keep_is_a_422_and_the_jobs_stay_readable(env: Env, admin: dict[str, str],
                                                                        case: str) -> None:
    job_id = _job(env, admin)
    spec, loc = SPECS_NO_DATABASE_CAN_KEEP[case]
    for route in ("/v1/jobs", "/v1/plans"):
        body = _raw(spec).replace(b'"@"', _deep(5000, b'"\\u0000"'))
        r = env.client.post(route, content=body, headers={**admin, **JSON})
        assert r.status_code == 422, (route, r.status_code, r.text[:300])
        error = r.json()["error"]
        assert error["code"] == "invalid_spec"
        if loc is not None:
            assert error["fields"][0]["loc"] == loc
    assert [j["id"] for j in env.client.get("/v1/jobs", headers=admin).json()["items"]] == [job_id]
    _everything_still_reads(env, admin, job_id)


MEASUREMENTS_NO_DATABASE_CAN_KEEP = {
    "NaN": b'{"kind": "report", "data": {"loss": NaN}}',
    "Infinity": b'{"kind": "report", "data": {"loss": [1.0, -Infinity]}}',
    "a number past a double": b'{"kind": "report", "data": {"loss": 1e400}}',
    "a lone surrogate": b'{"kind": "report", "data": {"note": "\\udc80"}}',
    "a surrogate as raw bytes": b'{"kind": "report", "data": {"note": "\xed\xb2\x80"}}',
    "600 levels deep": b'{"kind": "report", "data": ' + _deep(600) + b"}",
    "100000 levels deep": b'{"kind": "report", "data": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "a NUL 5000 levels deep": b'{"kind": "report", "data": ' + _deep(5000, b'"\\u0000"') + b"}",
    f"{MAX_JSON_DEPTH + 1} levels deep": _raw({"kind": "report", "data": _nested(MAX_JSON_DEPTH + 1)}),
}


@pytest.mark.parametrize("case", sorted(MEASUREMENTS_NO_DATABASE_CAN_KEEP))
def test_a_measurement_no_database_can_keep_is_a_422_and_the_job_stays_readable(env: Env, admin: dict[str, str],
                                                                               case: str) -> None:
    job_id = _job(env, admin)
    reporter = env.headers(env.token("job", job_id=job_id))
    r = env.client.post(f"/v1/jobs/{job_id}/measurements", content=MEASUREMENTS_NO_DATABASE_CAN_KEEP[case],
                        headers={**reporter, **JSON})
    assert r.status_code == 422, r.text[:300]
    assert r.json()["error"]["code"] == "validation_error" and r.json()["error"]["fields"]
    assert env.client.get(f"/v1/jobs/{job_id}", headers=admin).json()["measurements"] == {}
    _everything_still_reads(env, admin, job_id)


def test_the_deepest_nesting_allowed_is_stored_and_read_back(env: Env, admin: dict[str, str]) -> None:
    job_id = _job(env, admin)
    reporter = env.headers(env.token("job", job_id=job_id))
    data = _nested(MAX_JSON_DEPTH)  # 31 objects around a number; with the body around them, 32
    r = env.client.post(f"/v1/jobs/{job_id}/measurements", json={"kind": "report", "data": data}, headers=reporter)
    assert r.status_code == 201, r.text
    assert env.client.get(f"/v1/jobs/{job_id}", headers=admin).json()["measurements"]["report"]["data"] == data


def test_a_profile_with_nan_as_a_string_is_a_422(env: Env, admin: dict[str, str]) -> None:
    """Pydantic reads "NaN" and "Infinity" as floats: the summary is checked again after validation."""
    job_id = _job(env, admin)
    summary = analyze_traces(GLOO).model_dump(mode="json")
    rank = summary["ranks"][0] if isinstance(summary["ranks"], list) else next(iter(summary["ranks"].values()))
    name = next(k for k, v in rank.items() if isinstance(v, float))
    rank[name] = "NaN"
    r = env.client.post(f"/v1/jobs/{job_id}/profiles", json=summary, headers=admin)
    assert r.status_code == 422, r.text[:300]
    assert name in r.json()["error"]["fields"][0]["loc"]
    assert env.client.get(f"/v1/jobs/{job_id}/profiles", headers=admin).json() == []
    _everything_still_reads(env, admin, job_id)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # PostgreSQL refuses a lone surrogate at INSERT
def test_a_write_whose_response_cannot_be_rendered_rolls_back(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """Should a value ever pass the checks at the door, the route renders its response before the
    transaction commits: the write rolls back instead of leaving a row that no read can return."""
    admin = env.headers(env.token("admin"))
    from service.api import app as app_module
    from service.api.routers import jobs

    monkeypatch.setattr(app_module, "parse_storable_json", lambda body, **_: json.loads(body))
    monkeypatch.setattr(jobs, "check_storable", lambda value, **_: None)
    job_id = _job(env, admin)
    reporter = env.headers(env.token("job", job_id=job_id))
    r = env.client.post(f"/v1/jobs/{job_id}/measurements", content=b'{"kind": "report", "data": {"x": "\\udc80"}}',
                        headers={**reporter, **JSON})
    assert r.status_code == 422 and "cannot be stored and read back" in r.json()["error"]["message"]
    assert env.client.get(f"/v1/jobs/{job_id}", headers=admin).json()["measurements"] == {}
    kinds = [e["kind"] for e in env.client.get(f"/v1/jobs/{job_id}/events", headers=admin).json()]
    assert kinds == ["job.queued"]


# --- malformed JSON and media types ----------------------------------------------------------------

def test_malformed_json_is_a_400_naming_where_the_parser_stopped(env: Env, admin: dict[str, str]) -> None:
    for route in ("/v1/jobs", "/v1/plans", "/v1/teams", "/v1/tokens"):
        r = env.client.post(route, content=b'{"name": "x",\n  oops}', headers={**admin, **JSON})
        assert r.status_code == 400, (route, r.text)
        error = r.json()["error"]
        assert error["code"] == "bad_request"
        assert "line 2 column 3" in error["message"] and "character 16" in error["message"], error
    r = env.client.post("/v1/teams", content=b'{"name": "\xff"}', headers={**admin, **JSON})
    assert r.status_code == 400 and "UTF-8" in r.json()["error"]["message"]
    r = env.client.post("/v1/teams", content=b'{"name": ' + b"7" * 5000 + b"}", headers={**admin, **JSON})
    assert r.status_code == 400 and r.json()["error"]["code"] == "bad_request"


@pytest.mark.parametrize(("content_type", "body"), [
    ("text/plain", b'{"name": "alpha"}'),
    ("application/yaml", b"name: alpha\n"),
    ("application/x-www-form-urlencoded", b"name=alpha"),
    ("multipart/form-data; boundary=x", b"--x--\r\n"),
    (None, b'{"name": "alpha"}'),
])
def test_a_body_that_is_not_json_is_a_415(env: Env, admin: dict[str, str], content_type: str | None,
                                         body: bytes) -> None:
    headers = dict(admin) | ({"Content-Type": content_type} if content_type else {})
    r = env.client.post("/v1/teams", content=body, headers=headers)
    assert r.status_code == 415, r.text
    assert r.json()["error"]["code"] == "unsupported_media_type"
    assert env.client.get("/v1/teams", headers=admin).json() == []
    assert env.client.post("/v1/teams", json={"name": "alpha"}, headers=admin).status_code == 201
    assert env.client.post("/v1/teams", content=b'{"name": "beta"}',
                           headers={**admin, "Content-Type": "application/json; charset=utf-8"}).status_code == 201


def test_trace_uploads_must_be_multipart(env: Env, admin: dict[str, str]) -> None:
    job_id = _job(env, admin)
    r = env.client.post(f"/v1/jobs/{job_id}/profiles/traces", json={"files": []}, headers=admin)
    assert r.status_code == 415 and "multipart/form-data" in r.json()["error"]["message"]


# --- limits as the body arrives, and the token before the body -------------------------------------

def _chunks(body: bytes, size: int = 64 << 10) -> Iterator[bytes]:
    for start in range(0, len(body), size):
        yield body[start:start + size]


def test_a_chunked_body_over_the_limit_is_a_413(env: Env, live: str) -> None:
    admin = env.headers(env.token("admin"))
    spec = json.dumps(tiny()).encode()
    padded = spec[:-1] + b" " * (2_000_000 - len(spec)) + b"}"  # a valid 2 MB spec
    with httpx.Client(base_url=live, timeout=60) as client:
        r = client.post("/v1/jobs", content=_chunks(padded), headers={**admin, **JSON})
        assert "content-length" not in r.request.headers and r.request.headers["transfer-encoding"] == "chunked"
        assert r.status_code == 413, r.text[:300]
        assert r.json()["error"]["code"] == "too_large"
        r = client.post("/v1/jobs", content=_chunks(spec, 16), headers={**admin, **JSON})
        assert r.status_code == 201, r.text[:300]
        assert len(client.get("/v1/jobs", headers=admin).json()["items"]) == 1


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


class _PeakRss:
    """The largest resident size of this process (which runs the `live` server) while it is open."""

    def __enter__(self) -> _PeakRss:
        self.start = self.peak = _rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, _rss_bytes())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def growth(self) -> int:
        return self.peak - self.start


def _anonymous_upload(live: str, path: str, content_type: str, total: int) -> tuple[bytes, int]:
    """POST `total` bytes chunked, without a token, reading the answer as soon as it comes. Returns
    the answer's first bytes and how many body bytes had been sent by then."""
    url = urlsplit(live)
    chunk = b"x" * (1 << 20)
    sent = 0
    with socket.create_connection((url.hostname, url.port), timeout=60) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {url.netloc}\r\nContent-Type: {content_type}\r\n"
                     "Transfer-Encoding: chunked\r\n\r\n".encode())
        while sent < total:
            if select.select([sock], [], [], 0)[0]:
                break
            try:
                sock.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(chunk)
        else:
            sock.sendall(b"0\r\n\r\n")
        return sock.recv(4096), sent


MIB = 1 << 20


def test_an_anonymous_chunked_body_is_refused_before_it_is_read(env: Env, live: str) -> None:
    """256 MiB without a token: the 401 comes before the body is read, and the server's memory (this
    process: `live` runs uvicorn in a thread of it) does not grow by the body."""
    with _PeakRss() as rss:
        answer, sent = _anonymous_upload(live, "/v1/jobs", "application/json", 256 * MIB)
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
    assert sent < 64 * MIB, f"the 401 came after {sent >> 20} MiB"
    assert rss.growth < 64 * MIB, f"the server grew by {rss.growth >> 20} MiB"
    with httpx.Client(base_url=live) as client:  # the server is fine
        assert client.get("/healthz").status_code == 200


def test_an_anonymous_trace_upload_is_refused_before_it_is_spooled(env: Env, live: str) -> None:
    admin = env.headers(env.token("admin"))
    with httpx.Client(base_url=live) as client:
        job_id = client.post("/v1/jobs", json=tiny(), headers=admin).json()["id"]
    answer, sent = _anonymous_upload(live, f"/v1/jobs/{job_id}/profiles/traces", "multipart/form-data; boundary=b",
                                     300 * MIB)
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
    assert sent < 64 * MIB, f"the 401 came after {sent >> 20} MiB"


def _multipart(files: dict[str, bytes], boundary: str = "shardctl-test") -> bytes:
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="files"; filename="{name}"\r\n'
             f"Content-Type: application/json\r\n\r\n".encode() + data + b"\r\n" for name, data in files.items()]
    return b"".join(parts) + f"--{boundary}--\r\n".encode()


def test_a_trace_upload_has_a_total_cap_per_request(env: Env, live: str) -> None:
    """Each file under SHARDCTL_MAX_TRACE_BYTES, together over SHARDCTL_MAX_UPLOAD_BYTES: a 413 as the
    body arrives (chunked, so no Content-Length to check first), and nothing is kept."""
    admin = env.headers(env.token("admin"))
    env.app.state.settings.max_trace_bytes = 1 * MIB
    env.app.state.settings.max_upload_bytes = 2 * MIB
    body = _multipart({f"rank-{i}.json": b" " * (MIB - 1000) for i in range(4)})
    with httpx.Client(base_url=live, timeout=60) as client:
        job_id = client.post("/v1/jobs", json=tiny(), headers=admin).json()["id"]
        r = client.post(f"/v1/jobs/{job_id}/profiles/traces", content=_chunks(body),
                        headers={**admin, "Content-Type": "multipart/form-data; boundary=shardctl-test"})
        assert r.status_code == 413, r.text[:300]
        assert "2097152" in r.json()["error"]["message"]
        r = client.post(f"/v1/jobs/{job_id}/profiles/traces", content=body,  # with a Content-Length
                        headers={**admin, "Content-Type": "multipart/form-data; boundary=shardctl-test"})
        assert r.status_code == 413
    assert not list((env.app.state.settings.data_dir / "profiles").glob(f"{job_id}/*/*"))


def test_the_token_is_looked_up_once_per_request(env: Env, admin: dict[str, str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The gate keeps the principal it found for the route: checking before the body costs no extra query.
    The gate and the route's dependency both look tokens up through `deps.token_principal`."""
    from service.api import deps

    calls: list[str] = []
    real = deps.authenticate

    def counted(session: Any, secret: str, **kw: Any) -> Any:
        calls.append(secret)
        return real(session, secret, **kw)

    monkeypatch.setattr(deps, "authenticate", counted)
    assert env.client.post("/v1/teams", json={"name": "alpha"}, headers=admin).status_code == 201
    assert len(calls) == 1
    assert env.client.get("/v1/teams", headers=admin).status_code == 200
    assert len(calls) == 2
    r = env.client.post("/v1/teams", json={"name": "beta"}, headers=env.headers(env.token("member", team="alpha")))
    assert r.status_code == 403  # the role is still checked by the route


def test_refusals_keep_the_error_shape_and_www_authenticate(env: Env) -> None:
    for headers in ({}, {"Authorization": "Basic eDp5"}, {"Authorization": "Bearer shc_nope_nope"}):
        r = env.client.post("/v1/jobs", json=tiny(), headers=headers)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert r.json()["error"]["code"] == "unauthorized"
    assert env.client.get("/healthz").status_code == 200
