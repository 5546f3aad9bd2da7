"""A job's files are hostile input: a job that swaps its own log for a FIFO (or a link, or a device)
must not hang the API or the dispatcher for anyone, before or after it exits."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from service.api.app import create_app
from service.settings import Settings
from service.store.db import make_engine, make_sessionmaker
from tests.db_fixtures import Env, LiveServer
from tests.specs import tiny
from workers.backends import jobfiles
from workers.backends.local import LocalBackend
from workers.backends.logfiles import FileSource, read_files, read_in_folder
from workers.backends.outputs import BackendOutputs
from workers.dispatch.context import DispatcherConfig
from workers.dispatcher import Dispatcher

#: Seconds any answer may take here before the test calls it a hang (a liveness bound, not a timing).
HANG_S = 30.0

#: The job: replace its own node log by a FIFO, say so, wait for `go`, then fail.
SWAP = ("import os, pathlib, sys, time\n"
        "log = pathlib.Path('..') / 'node0.log'\n"
        "os.remove(log); os.mkfifo(log, 0o600)\n"
        "pathlib.Path('swapped').touch()\n"
        "while not pathlib.Path('go').exists():\n    time.sleep(0.1)\n"
        "sys.exit(4)\n")


@contextlib.contextmanager
def unblocked(fifo: Path) -> Iterator[None]:
    """On the way out, open `fifo` for writing and close it for a while, so that the readers stuck on it
    without the fix are released and the test run ends (with its failure) instead of hanging."""
    try:
        yield
    finally:
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            time.sleep(0.01)


def test_the_readers_refuse_a_fifo_a_link_and_a_device_at_once(tmp_path: Path) -> None:
    fifo, link, secret = tmp_path / "fifo", tmp_path / "link", tmp_path / "secret"
    os.mkfifo(fifo)
    secret.write_text("the server's own file\n")
    link.symlink_to(secret)
    with ThreadPoolExecutor(1) as pool, unblocked(fifo):
        for path in (fifo, link, Path("/dev/zero")):
            with pytest.raises(jobfiles.NotRegular):
                pool.submit(jobfiles.read_at, path, 0, 100).result(timeout=HANG_S)
        sources = [FileSource(key="n", path=fifo, stream="output"), FileSource(key="l", path=link, stream="output")]
        chunk = pool.submit(read_files, sources, rank=None, cursor=None, limit=10, finished=True).result(timeout=HANG_S)
    assert chunk.lines == [] and chunk.finished
    (tmp_path / "out").mkdir()
    os.mkfifo(tmp_path / "out" / "pipe")
    with unblocked(tmp_path / "out" / "pipe"), pytest.raises(Exception, match="no file"):
        read_in_folder(tmp_path / "out", "pipe", max_bytes=100)


def test_a_read_that_never_answers_times_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file system that stopped answering: the caller gets an error after the timeout, not a hang."""
    release = threading.Event()

    def stalled(path: Path) -> tuple[int, int]:
        release.wait()
        raise FileNotFoundError(path)

    monkeypatch.setattr(jobfiles, "_open", stalled)
    try:
        with pytest.raises(jobfiles.JobFileTimeout):
            jobfiles.read_at(tmp_path / "log", 0, 10, timeout_s=0.2)
    finally:
        release.set()


@pytest.fixture
def served(db_url: str, tmp_path: Path) -> Iterator[tuple[Env, str]]:
    """The API with the local backend's outputs, as `shardctl serve` wires it, on a live port."""
    from fastapi.testclient import TestClient

    settings = Settings(database_url=db_url, data_dir=tmp_path, events_poll_s=0.05)
    engine = make_engine(db_url)
    app = create_app(settings, engine=engine, log_reader=BackendOutputs({"local": LocalBackend(tmp_path / "local")}))
    with TestClient(app) as client, LiveServer(app) as url:
        yield Env(app=app, client=client, url=db_url), url
    engine.dispose()


class Loop:
    """The dispatcher's loop in a thread, as `shardctl worker` runs it; `cycles` counts finished cycles."""

    def __init__(self, env: Env, folder: Path) -> None:
        self.dispatcher = Dispatcher(make_sessionmaker(make_engine(env.url)), {"local": LocalBackend(folder)},
                                     DispatcherConfig(retry_backoff_s=0.1))
        self.cycles, self.stop = 0, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            self.dispatcher.run_once()
            self.cycles += 1
            time.sleep(0.05)

    def alive_for(self, cycles: int) -> None:
        """Wait until `cycles` more cycles have finished: the loop is not stuck."""
        target, deadline = self.cycles + cycles, time.monotonic() + HANG_S
        while self.cycles < target:
            assert time.monotonic() < deadline, "the dispatcher's loop is stuck"
            time.sleep(0.05)


def wait_for(what: str, check: object, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_a_job_with_a_fifo_log_hangs_nothing_for_another_team(served: tuple[Env, str], tmp_path: Path) -> None:
    env, url = served
    member_a = env.headers(env.token("member", team="team-a"))
    member_b = env.headers(env.token("member", team="team-b"))
    one = {"resources": {"gpus_per_node": 1}}
    r = env.client.post("/v1/jobs", json=tiny(entrypoint={"command": ["python", "-c", SWAP]}, **one), headers=member_a)
    assert r.status_code == 201, r.text
    hostile = r.json()["id"]
    folder = tmp_path / "local"
    attempt = folder / f"shardctl-{hostile}-1"
    loop = Loop(env, folder)
    loop.thread.start()
    with unblocked(attempt / "node0.log"), httpx.Client(base_url=url, timeout=HANG_S) as http:
        try:
            wait_for("the job to swap its log", lambda: (attempt / "out" / "swapped").exists())
            # Team A reads its own log many times at once: each answer comes, with no line.
            with ThreadPoolExecutor(16) as pool:
                answers = list(pool.map(lambda _: http.get(f"/v1/jobs/{hostile}/logs", headers=member_a),
                                        range(32)))
            assert {a.status_code for a in answers} == {200}
            # Team B is served as usual, and its job runs, while the FIFO is there.
            assert http.get("/healthz").status_code == 200
            assert http.get("/v1/jobs", headers=member_b).status_code == 200
            spec_b = tiny(entrypoint={"command": ["python", "-c", "print('b ran')"]}, **one)
            job_b = http.post("/v1/jobs", json=spec_b, headers=member_b).json()["id"]
            wait_for("team B's job", lambda: http.get(f"/v1/jobs/{job_b}", headers=member_b).json()["status"]
                     == "SUCCEEDED")
            # The hostile job fails with its FIFO still there: the dispatcher reads its tail and goes on.
            (attempt / "out" / "go").touch()
            wait_for("the hostile job to fail", lambda: http.get(f"/v1/jobs/{hostile}", headers=member_a)
                     .json()["status"] == "FAILED")
            loop.alive_for(3)
            job = http.get(f"/v1/jobs/{hostile}", headers=member_a).json()
            assert job["attempts"][0]["exit_code"] == 4
            after = http.get(f"/v1/jobs/{hostile}/logs", headers=member_a)
            assert after.status_code == 200, after.text
            assert http.get("/healthz").status_code == 200
            spec_c = tiny(entrypoint={"command": ["python", "-c", "print('c ran')"]}, **one)
            job_c = http.post("/v1/jobs", json=spec_c, headers=member_b).json()["id"]
            wait_for("team B's next job", lambda: http.get(f"/v1/jobs/{job_c}", headers=member_b).json()["status"]
                     == "SUCCEEDED")
        finally:
            loop.stop.set()
    loop.thread.join(timeout=HANG_S)


def test_a_symbolic_link_log_does_not_read_the_server_s_files(tmp_path: Path) -> None:
    """A job that points its log at a file of the server's: the reader shows nothing of it."""
    secret = tmp_path / "server-secret"
    secret.write_text("SHARDCTL_DATABASE_URL=postgresql://admin:hunter2@db\n")
    log = tmp_path / "node0.log"
    log.symlink_to(secret)
    chunk = read_files([FileSource(key="node0", path=log, stream="output")], rank=None, cursor=None, limit=10,
                       finished=True)
    assert all("hunter2" not in line.line for line in chunk.lines) and chunk.lines == []
