"""What a local job can reach of the server, and how long its token lives.

A member's job runs as the server's OS user. It must not find the server's settings in its
environment (nor in its parent's), nor the admin token the server keeps in its CLI config through
HOME or XDG paths; what the attempt writes is its owner's only. A job's token stops working a grace
period after the job ends. docs/security.md says what this does not isolate.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from service import jobenv
from tests.db_fixtures import Env
from tests.specs import launch_request
from tests.support.dispatch import drive, make_dispatcher, one_process
from workers.backends.base import Handle, Observation, RunState
from workers.backends.local import LocalBackend

PROBE = r"""
import json, os, sys
from pathlib import Path
import platformdirs
home = os.path.expanduser("~")
candidates = [os.path.join(home, ".config", "shardctl", "config.json"),
              os.path.join(platformdirs.user_config_dir("shardctl"), "config.json")]
if os.environ.get("XDG_CONFIG_HOME"):
    candidates.append(os.path.join(os.environ["XDG_CONFIG_HOME"], "shardctl", "config.json"))
try:
    parent_env = open(f"/proc/{os.getppid()}/environ", "rb").read().decode(errors="replace")
except OSError:
    parent_env = ""
Path("probe.txt").write_text("written by the job")
json.dump({"env": dict(os.environ), "home": home, "cwd": os.getcwd(),
           "found": [c for c in candidates if os.path.exists(c)], "parent_env": parent_env},
          open(sys.argv[1], "w"))
"""


@pytest.fixture
def server_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The server user's HOME, with the admin token in its CLI config where `shardctl serve` saves it,
    the server's settings in its environment, and the usual umask (022)."""
    home = tmp_path / "server-home"
    config = home / ".config" / "shardctl" / "config.json"
    config.parent.mkdir(parents=True)
    config.write_text(json.dumps({"url": "http://127.0.0.1:8686", "token": "shc_admin_secret"}))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("SHARDCTL_DATABASE_URL", "postgresql://shardctl:hunter2@db/shardctl")
    monkeypatch.setenv("SHARDCTL_CONFIG", str(config))
    old = os.umask(0o022)
    yield home
    os.umask(old)


def wait(backend: LocalBackend, handle: Handle, timeout: float = 90) -> RunState:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = backend.poll([handle])[handle.name].state
        if state in (RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED):
            return state
        time.sleep(0.2)
    raise AssertionError(f"{handle.name} did not finish")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_job_has_its_own_home_and_cannot_find_the_servers_config_or_settings(server_home: Path,
                                                                             tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "runs")
    seen = tmp_path / "seen.json"
    handle = backend.submit(launch_request("shardctl-1-1", ["python", "-c", PROBE, str(seen)], token="shc_job_x"))
    assert wait(backend, handle) == RunState.SUCCEEDED, backend.poll([handle])[handle.name]
    got = json.loads(seen.read_text())
    attempt = backend.folder / "shardctl-1-1"
    assert got["found"] == []  # neither ~/.config/shardctl nor the XDG config folder leads to the server's
    assert got["home"] == str(attempt / "home") and not got["home"].startswith(str(server_home))
    assert got["env"]["XDG_CONFIG_HOME"].startswith(str(attempt / "home"))
    assert got["cwd"] == str(attempt / "out")
    for name in ("SHARDCTL_DATABASE_URL", "SHARDCTL_CONFIG"):
        assert name not in got["env"]
        assert name not in got["parent_env"]  # the supervisor, its parent, was not given them either
    assert "hunter2" not in json.dumps(got) and "shc_admin_secret" not in json.dumps(got)
    assert got["env"][jobenv.TOKEN] == "shc_job_x"


def test_the_attempt_folder_and_what_it_holds_are_the_owners_only(server_home: Path, tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "runs")
    handle = backend.submit(launch_request("shardctl-2-1", ["python", "-c", PROBE, str(tmp_path / "seen.json")],
                                           token="shc_job_x", user_env={"WANDB_API_KEY": "k"}))
    assert wait(backend, handle) == RunState.SUCCEEDED
    attempt = backend.folder / "shardctl-2-1"
    assert "shc_job_x" in (attempt / "request.json").read_text()  # the supervisor needs it
    assert mode(backend.folder) == 0o700
    for folder in (attempt, attempt / "out", attempt / "home"):
        assert mode(folder) == 0o700, folder
    for file in (attempt / "request.json", attempt / "state.json", attempt / "exit.json", attempt / "node0.log",
                 attempt / "out" / "probe.txt", backend.folder / ".shardctl-2-1.supervisor.log"):
        assert mode(file) == 0o600, file


def test_the_preview_shows_the_jobs_own_home(tmp_path: Path, server_home: Path) -> None:
    backend = LocalBackend(tmp_path / "runs")
    shown = backend.render(launch_request("shardctl-3-1", ["python", "-c", "pass"])).content["env"]
    assert shown["HOME"] == "<runs>/shardctl-3-1/home"  # the job's own, without the server's folder
    assert "SHARDCTL_DATABASE_URL" not in shown


# -- job tokens end with the job --------------------------------------------------------------------


def _job_secret(tmp_path: Path, job_id: int) -> str:
    """The job token the dispatcher handed the attempt, as the local supervisor reads it."""
    secret: str = json.loads((tmp_path / f"shardctl-{job_id}-1" / "request.json").read_text())["job"]["token"]
    assert secret.startswith("shc_")
    return secret


def test_a_jobs_token_works_while_it_runs_and_a_grace_after_it_ends(env: Env, admin: dict[str, str],
                                                                    tmp_path: Path) -> None:
    job_id = env.client.post("/v1/jobs", json=one_process("import time; time.sleep(60)"),
                             headers=admin).json()["id"]
    dispatcher = make_dispatcher(env, tmp_path)
    drive(env, dispatcher, job_id, admin, until={"PENDING", "RUNNING"})
    token = env.headers(_job_secret(tmp_path, job_id))
    assert env.client.get("/v1/whoami", headers=token).status_code == 200  # live while the job runs
    LocalBackend(tmp_path).cancel(Handle(name=f"shardctl-{job_id}-1"))  # stop the process; the test decides below
    assert dispatcher.apply(job_id, 1, Observation(state=RunState.SUCCEEDED, exit_code=0)) == 1
    assert env.client.get("/v1/whoami", headers=token).status_code == 200  # the grace for its final report
    env.app.state.settings.job_token_grace_s = 0
    assert env.client.get("/v1/whoami", headers=token).status_code == 401  # past it, with no write at all


def test_a_token_of_a_job_the_api_ended_stops_with_it(env: Env, admin: dict[str, str]) -> None:
    """A QUEUED job (waiting for a retry, with an earlier attempt's token) cancelled through the API:
    no dispatcher touches it, and its token ends all the same."""
    env.app.state.settings.job_token_grace_s = 0
    job_id = env.client.post("/v1/jobs", json=one_process("pass"), headers=admin).json()["id"]
    token = env.headers(env.token("job", job_id=job_id))
    assert env.client.get("/v1/whoami", headers=token).status_code == 200
    assert env.client.post(f"/v1/jobs/{job_id}/cancel", headers=admin).json()["status"] == "CANCELLED"
    assert env.client.get("/v1/whoami", headers=token).status_code == 401


if sys.platform != "linux":  # /proc and modes are what these tests read
    pytestmark = pytest.mark.skip("Linux only")
