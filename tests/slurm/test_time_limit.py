"""A Slurm time-limit kill is a timeout, however slowly the node starts the launcher.

Slurm sends the time-limit warning (`--signal=USR2@N`) up to 60 s earlier than asked (sbatch(1)): for a
1-minute limit as early as the job starts, while the interpreter may still be importing. Before the fix,
on a loaded machine, that warning killed the launcher by its default action: sacct recorded FAILED with
exit code 12 and the backend, reading it right, said `program_error` long before the limit. The sbatch
script now starts the interpreter with the signal ignored (`submission.launcher_python`).

The first cases need no cluster: they send the signal before any handler exists, which is the slow
node's moment made certain. The cluster cases submit their own 1-minute jobs, all at once when the first
of them runs (Slurm checks limits about every 30 s, so each ends 60-90 s after it starts): one through
the backend, one through the backend whose launcher starts 35 s late (after the warning has come), one
through the API and the dispatcher. They run in the `urgent` partition, so that the preemption tests
cannot requeue them (which would restart their clocks)."""

from __future__ import annotations

import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.slurm.conftest import TERMINAL, URGENT, launch_request, py, sacct_states, wait_for
from tests.specs import tiny
from workers.backends.base import Handle, RunState
from workers.backends.slurm import SlurmBackend
from workers.backends.slurm.launcher import preemption_signal
from workers.backends.slurm.submission import launcher_python, submit_command

SLEEPER = py("import time; print('sleeping', flush=True); time.sleep(300)")
#: signals itself before it installs a handler (the slow node: the warning first), then installs one
#: (as submitit and the launcher do) and signals itself again: that one must reach the handler
EARLY_SIGNAL = ("import os, signal\n"
                "os.kill(os.getpid(), signal.SIGUSR2)\n"
                "got = []\n"
                "signal.signal(signal.SIGUSR2, lambda signum, frame: got.append(signum))\n"
                "os.kill(os.getpid(), signal.SIGUSR2)\n"
                "print('survived', got == [signal.SIGUSR2], flush=True)\n")


# -- no cluster needed -----------------------------------------------------------------------------

def test_the_warning_before_any_handler_kills_an_interpreter_started_plainly() -> None:
    """The failure: a default action, whatever the backend later reads in sacct."""
    assert preemption_signal() == signal.SIGUSR2
    done = subprocess.run([sys.executable, "-c", EARLY_SIGNAL], capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGUSR2 and "survived" not in done.stdout


def test_the_launcher_starts_with_the_warning_ignored_and_its_handlers_still_work() -> None:
    """The interpreter as the sbatch script starts it (through a shell, as `srun`'s command line)."""
    command = f"{launcher_python(sys.executable)} -c {shlex.quote(EARLY_SIGNAL)}"
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (0, "survived True"), done.stderr


def test_the_sbatch_script_starts_the_launcher_that_way(tmp_path: Path) -> None:
    backend = SlurmBackend(folder=tmp_path, python=sys.executable, runner=lambda *a, **kw: None)  # type: ignore
    req = launch_request(SLEEPER, nodes=1, time_limit="00:01:00")
    script = backend.render(req).content["sbatch_script"]
    srun = [line for line in script.splitlines() if line.startswith("srun ")]
    assert len(srun) == 1 and srun[0].endswith(" " + submit_command(sys.executable, backend.job_folder(req.name)))
    assert f"/bin/sh -c 'trap \"\" USR2; exec \"$0\" \"$@\"' {shlex.quote(sys.executable)} -u -m " in srun[0]


# -- on the cluster --------------------------------------------------------------------------------

@dataclass
class Limited:
    """The module's 1-minute-limit jobs, submitted together."""

    plain: Handle
    slow: Handle
    slow_backend: SlurmBackend
    api: dict[str, Any]


def slow_python(folder: Path, delay_s: int) -> str:
    """An interpreter that starts submitit's launcher `delay_s` late (any other command at once): what a
    loaded node or a fresh install does to the launcher, made long enough that the warning comes first."""
    folder.mkdir(parents=True)
    wrapper = folder / "python"
    wrapper.write_text(f"#!/bin/sh\ncase \"$*\" in *submitit.core._submit*) sleep {delay_s};; esac\n"
                       f"exec {shlex.quote(sys.executable)} \"$@\"\n")
    wrapper.chmod(0o755)
    return str(wrapper)


@pytest.fixture(scope="module")
def limited(backend: SlurmBackend, partition: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Limited]:
    from fastapi.testclient import TestClient

    from service.api.app import create_app
    from service.settings import Settings
    from service.store import migrate
    from service.store.db import make_engine, make_sessionmaker
    from service.store.tokens import create_token
    from service.store.vocab import Role
    from workers.dispatch.context import DispatcherConfig
    from workers.dispatcher import Dispatcher

    folder = tmp_path_factory.mktemp("time-limit")
    slow_backend = SlurmBackend(folder=folder / "slow", partition=partition,
                                python=slow_python(folder / "bin", delay_s=35))
    # the same limit through the whole product: `time_limit: 00:01:00` in a spec submitted through the API
    # (its own SQLite database) and handed to Slurm by the dispatcher
    url = f"sqlite:///{folder / 'shardctl.db'}"
    migrate.upgrade(url)
    engine = make_engine(url)
    sessions = make_sessionmaker(engine)
    with sessions.begin() as session:
        _, token = create_token(session, role=Role.ADMIN)
    headers = {"Authorization": f"Bearer {token}"}
    spec = tiny(resources={"gpus_per_node": 1}, entrypoint={"command": SLEEPER},
                backend={"kind": "slurm", "partition": URGENT, "time_limit": "00:01:00"})
    with ExitStack() as stack:  # undone in reverse: the API's cancel first, the database last
        stack.callback(engine.dispose)
        plain = backend.submit(launch_request(SLEEPER, nodes=1, time_limit="00:01:00", partition=URGENT))
        stack.callback(backend.cancel, plain)
        slow = slow_backend.submit(launch_request(SLEEPER, nodes=1, time_limit="00:01:00", partition=URGENT))
        stack.callback(slow_backend.cancel, slow)
        client = stack.enter_context(TestClient(create_app(Settings(database_url=url, data_dir=folder),
                                                           engine=engine)))
        job_id = client.post("/v1/jobs", json=spec, headers=headers).json()["id"]
        dispatcher = Dispatcher(sessions, {"slurm": backend}, DispatcherConfig())
        stack.callback(dispatcher.run_once)
        stack.callback(client.post, f"/v1/jobs/{job_id}/cancel", headers=headers)
        dispatcher.run_once()
        yield Limited(plain=plain, slow=slow, slow_backend=slow_backend,
                      api={"client": client, "headers": headers, "job_id": job_id, "dispatcher": dispatcher})


def test_a_time_limit_kill_is_reported_as_timeout(backend: SlurmBackend, limited: Limited) -> None:
    obs = wait_for(backend, limited.plain, lambda o: o.state in TERMINAL, timeout=180)
    assert obs.state == RunState.FAILED and obs.failure == "timeout", obs
    assert "time limit" in (obs.reason or "")
    assert limited.plain.backend_id is not None and sacct_states(limited.plain.backend_id) == ["TIMEOUT"]
    assert obs.log_tail is not None and "sleeping" in obs.log_tail


def test_a_launcher_that_starts_after_the_warning_still_ends_in_a_timeout(limited: Limited) -> None:
    obs = wait_for(limited.slow_backend, limited.slow, lambda o: o.state in TERMINAL, timeout=180)
    assert obs.state == RunState.FAILED and obs.failure == "timeout", obs
    assert limited.slow.backend_id is not None and sacct_states(limited.slow.backend_id) == ["TIMEOUT"]


def test_a_time_limit_kill_fails_the_job_through_the_api_as_a_timeout(limited: Limited) -> None:
    client, headers, job_id = (limited.api[k] for k in ("client", "headers", "job_id"))
    dispatcher = limited.api["dispatcher"]
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        dispatcher.run_once()
        job = client.get(f"/v1/jobs/{job_id}", headers=headers).json()
        if job["status"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
            break
        time.sleep(1)
    assert job["status"] == "FAILED", job["status"]
    last = client.get(f"/v1/jobs/{job_id}/events", headers=headers).json()[-1]
    assert last["data"]["failure"] == "timeout" and "time limit" in last["message"]
    assert len(job["attempts"]) == 1  # a time limit is not retried
    assert job["attempts"][0]["failure"] == "timeout" and "time limit" in job["attempts"][0]["exit_reason"]
    assert sacct_states(job["attempts"][0]["backend_id"]) == ["TIMEOUT"]
