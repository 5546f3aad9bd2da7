"""The local backend with real processes: torchrun groups on this machine, detached and adoptable."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from service import jobenv
from tests.specs import launch_request, tiny_plan
from workers.backends.base import Handle, LaunchRequest, RunState, attempt_name
from workers.backends.local import LocalBackend


def request(name: str, command: list[str], nodes: int = 1, procs: int = 1, **kw: object) -> LaunchRequest:
    return launch_request(name, command, nodes=nodes, procs=procs, **kw)  # type: ignore[arg-type]


def wait(backend: LocalBackend, handle: Handle, until: set[RunState], timeout: float = 90) -> RunState:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = backend.poll([handle])[handle.name].state
        if state in until:
            return state
        time.sleep(0.2)
    raise AssertionError(f"{handle.name} did not reach {until}")


def py(code: str) -> list[str]:
    return ["python", "-c", code]


@pytest.fixture
def backend(tmp_path: Path) -> LocalBackend:
    return LocalBackend(tmp_path / "local")


@pytest.mark.slow
def test_a_two_node_job_runs_every_rank_once(backend: LocalBackend, tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    code = f"import os; open('{marks}/' + os.environ['RANK'], 'w').write(os.environ['WORLD_SIZE'])"
    handle = backend.submit(request("shardctl-1-1", py(code), nodes=2, procs=2))
    assert wait(backend, handle, {RunState.SUCCEEDED, RunState.FAILED}) == RunState.SUCCEEDED
    assert sorted(p.name for p in marks.iterdir()) == ["0", "1", "2", "3"]
    assert {p.read_text() for p in marks.iterdir()} == {"4"}
    assert len(backend.poll([handle])[handle.name].nodes) == 2


def test_a_failing_program_reports_its_exit_code_and_log_tail(backend: LocalBackend) -> None:
    handle = backend.submit(request("shardctl-2-1", py("import sys; print('boom: bad config'); sys.exit(7)")))
    assert wait(backend, handle, {RunState.SUCCEEDED, RunState.FAILED}) == RunState.FAILED
    obs = backend.poll([handle])[handle.name]
    assert obs.exit_code == 7 and obs.failure == "program_error"
    assert "boom: bad config" in (obs.log_tail or "")


def test_submitting_a_name_twice_runs_it_once(backend: LocalBackend, tmp_path: Path) -> None:
    counter = tmp_path / "runs"
    code = f"open('{counter}', 'a').write('x')"
    first = backend.submit(request("shardctl-3-1", py(code)))
    second = backend.submit(request("shardctl-3-1", py(code)))
    assert first == second == backend.find("shardctl-3-1")
    wait(backend, first, {RunState.SUCCEEDED})
    assert counter.read_text() == "x"
    assert backend.find(attempt_name(3, 2)) is None
    assert backend.poll([Handle(name="shardctl-9-9")])["shardctl-9-9"].state == RunState.MISSING


def test_cancel_stops_the_processes(backend: LocalBackend) -> None:
    handle = backend.submit(request("shardctl-4-1", py("import time; time.sleep(120)")))
    wait(backend, handle, {RunState.RUNNING})
    backend.cancel(handle)
    assert wait(backend, handle, {RunState.CANCELLED, RunState.FAILED, RunState.SUCCEEDED}, 30) == RunState.CANCELLED
    backend.cancel(handle)  # idempotent


def test_jobs_survive_the_process_that_submitted_them(backend: LocalBackend, tmp_path: Path) -> None:
    import subprocess

    done = tmp_path / "done"
    script = (f"from pathlib import Path; from workers.backends.local import LocalBackend; "
              f"from tests.specs import launch_request; "
              f"LocalBackend(Path('{backend.folder}')).submit(launch_request('shardctl-5-1', ['python', '-c', "
              f"\"import time; time.sleep(1.5); open('{done}', 'w').write('ok')\"], nodes=1, procs=1))")
    subprocess.run([sys.executable, "-c", script], check=True, cwd=Path(__file__).parents[2], timeout=60)
    handle = Handle(name="shardctl-5-1", backend_id="shardctl-5-1")
    assert backend.poll([handle])[handle.name].state in (RunState.PENDING, RunState.RUNNING)
    assert wait(backend, handle, {RunState.SUCCEEDED}) == RunState.SUCCEEDED
    assert done.read_text() == "ok"


def test_render(backend: LocalBackend) -> None:
    rendered = backend.render(request("shardctl-7-1", py("pass"), nodes=2, procs=4, token="shc_1_secret"))
    commands = rendered.content["commands"]
    assert len(commands) == 2 and "--nproc-per-node=4" in commands[0] and "--node-rank=1" in commands[1]
    shown = rendered.content["env"]
    assert shown[jobenv.TOKEN] == "<redacted>" and shown[jobenv.JOB_ID] == "1"
    # The server's own paths stay on the server: its runs folder and what the job inherits.
    assert shown[jobenv.OUT_DIR] == "<runs>/shardctl-7-1/out" and shown["PATH"] == "<inherited>"
    assert str(backend.folder) not in json.dumps(rendered.content) and os.environ["PATH"] not in json.dumps(shown)


def test_a_job_gets_the_contract_and_not_the_servers_secrets(backend: LocalBackend, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The job sees the job contract (service.jobenv) and its own entrypoint.env, never the server's
    settings: a member's program must not read the control plane's database password."""
    monkeypatch.setenv("SHARDCTL_DATABASE_URL", "postgresql://shardctl:hunter2@db/shardctl")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "server-only")
    seen = tmp_path / "env.json"
    code = f"import json, os; open('{seen}', 'w').write(json.dumps(dict(os.environ)))"
    handle = backend.submit(request("shardctl-8-1", py(code), token="shc_1_secret", user_env={"MODE": "a"}))
    assert wait(backend, handle, {RunState.SUCCEEDED, RunState.FAILED}) == RunState.SUCCEEDED
    env = json.loads(seen.read_text())
    assert "SHARDCTL_DATABASE_URL" not in env and "AWS_SECRET_ACCESS_KEY" not in env
    assert env["MODE"] == "a" and env[jobenv.TOKEN] == "shc_1_secret"
    got = jobenv.JobEnv.from_environ(env)
    assert got.plan == tiny_plan() and (got.job_id, got.attempt) == (1, 1)
    assert got.out_dir == str(backend.folder / "shardctl-8-1" / "out")
