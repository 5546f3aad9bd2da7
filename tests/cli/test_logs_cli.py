"""`shardctl logs` and `shardctl artifacts` against a live API whose local backend runs real two-rank jobs."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from service.cli import wiring
from service.cli.main import app
from service.settings import Settings
from service.store.db import make_engine, make_sessionmaker
from tests.db_fixtures import Env, LiveServer
from tests.specs import tiny
from workers.backends.local import LocalBackend
from workers.backends.outputs import BackendOutputs
from workers.dispatch.context import DispatcherConfig
from workers.dispatcher import Dispatcher

runner = CliRunner()
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


@pytest.fixture
def cli(env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., tuple[int, str]]]:
    """`shardctl ...` against a live API built as `shardctl serve` builds it (`wiring.make_app`: the
    local backend's outputs wired in), on the env's database."""
    settings = Settings(database_url=env.url, data_dir=tmp_path, logs_poll_s=0.05)
    served = wiring.make_app(settings, make_sessionmaker(make_engine(env.url)),
                             {"local": LocalBackend(tmp_path / "local")}, "http://127.0.0.1:1")
    assert isinstance(served.state.log_reader, BackendOutputs)
    monkeypatch.setenv("SHARDCTL_CONFIG", str(tmp_path / "cli.json"))
    monkeypatch.setenv("SHARDCTL_TOKEN", env.token("admin"))

    def run(*args: str) -> tuple[int, str]:
        result = runner.invoke(app, list(args))
        return result.exit_code, result.output

    with LiveServer(served) as url:
        monkeypatch.setenv("SHARDCTL_URL", url)
        yield run


def _submit(env: Env, code: str) -> int:
    headers = env.headers(env.token("admin"))
    r = env.client.post("/v1/jobs", json=tiny(entrypoint={"command": ["python", "-c", code]}), headers=headers)
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


@pytest.fixture
def driver(env: Env, tmp_path: Path) -> Iterator[Callable[[], None]]:
    """Start a dispatcher thread on the local backend (the API's folder); stopped at the end."""
    stop = threading.Event()
    threads: list[threading.Thread] = []

    def start() -> None:
        d = Dispatcher(make_sessionmaker(make_engine(env.url)), {"local": LocalBackend(tmp_path / "local")},
                       DispatcherConfig(retry_backoff_s=0.1))

        def loop() -> None:
            while not stop.is_set():
                d.run_once()
                time.sleep(0.1)

        threads.append(threading.Thread(target=loop, daemon=True))
        threads[-1].start()

    yield start
    stop.set()
    for t in threads:
        t.join(timeout=30)


def _wait_end(env: Env, job_id: int) -> None:
    headers = env.headers(env.token("admin"))
    deadline = time.monotonic() + 120
    while env.client.get(f"/v1/jobs/{job_id}", headers=headers).json()["status"] not in TERMINAL:
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_logs_merged_by_rank_one_rank_and_json(cli, env: Env, driver: Callable[[], None]) -> None:
    job_id = _submit(env, "import os\nr = os.environ['RANK']\nfor i in range(2):\n    print(f'step {i} on {r}')\n")
    driver()
    _wait_end(env, job_id)
    code, out = cli("logs", str(job_id))
    assert code == 0, out
    for r in (0, 1):
        assert [x for x in out.splitlines() if x.startswith(f"[rank {r}]")] == [f"[rank {r}] step 0 on {r}",
                                                                            f"[rank {r}] step 1 on {r}"]
    code, out = cli("logs", str(job_id), "--rank", "1")
    assert code == 0 and out.splitlines() == ["step 0 on 1", "step 1 on 1"]
    code, out = cli("logs", str(job_id), "--rank", "0", "--json", "--attempt", "1")
    rows = [json.loads(x) for x in out.splitlines()]
    assert [(x["rank"], x["stream"], x["line"]) for x in rows] == [(0, "output", "step 0 on 0"),
                                                                  (0, "output", "step 1 on 0")]
    code, out = cli("logs", "424242")
    assert code == 1 and "no job 424242" in out


def test_logs_follow_prints_live_until_the_attempt_ends(cli, env: Env, driver: Callable[[], None]) -> None:
    job_id = _submit(env, "import os, time\nr = os.environ['RANK']\nprint(f'before {r}', flush=True)\n"
                          "time.sleep(1.5)\nprint(f'after {r}', flush=True)\n")
    driver()  # the job is still queued: `-f` waits for its attempt, then follows it to the end
    code, out = cli("logs", str(job_id), "-f")
    assert code == 0, out
    lines = out.splitlines()
    for r in (0, 1):
        assert lines.index(f"[rank {r}] before {r}") < lines.index(f"[rank {r}] after {r}")
    assert len([x for x in lines if x.startswith("[rank")]) == 4  # each once


def test_artifacts_listed_and_downloaded(cli, env: Env, driver: Callable[[], None], tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    job_id = _submit(env, "import os\nif os.environ['RANK'] == '0':\n    os.makedirs('traces')\n"
                          "    open('traces/rank0.json', 'w').write('{}')\n    open('report.json', 'w').write('[1]')\n")
    driver()
    _wait_end(env, job_id)
    code, out = cli("artifacts", str(job_id))
    assert code == 0 and "report.json" in out and "traces/rank0.json" in out and "attempt 1" in out
    code, out = cli("artifacts", str(job_id), "--json")
    assert {a["path"]: a["size"] for a in json.loads(out)["artifacts"]} == {"report.json": 3, "traces/rank0.json": 2}
    monkeypatch.chdir(tmp_path)
    code, out = cli("artifacts", str(job_id), "--get", "report.json")
    assert code == 0 and (tmp_path / "report.json").read_text() == "[1]"
    code, out = cli("artifacts", str(job_id), "--get", "missing.txt")
    assert code == 1 and "missing.txt" in out
