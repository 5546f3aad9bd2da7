"""Local jobs run as another OS user (SHARDCTL_LOCAL_RUN_AS): the job cannot read the server's files or
its processes' environment, and still writes its outputs, logs and checkpoints."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.specs import launch_request
from workers.backends.base import Handle, RunState
from workers.backends.local import LocalBackend

USER = "nobody"
PYTHON = "/usr/bin/python3"  # the system's: the job's user may not reach the checkout's virtual environment


def _can_run() -> str | None:
    if os.geteuid() != 0:
        return "jobs run as another user only when the server runs as root"
    try:
        pwd.getpwnam(USER)
    except KeyError:
        return f"no {USER!r} user on this machine"
    if not Path(PYTHON).exists():
        return f"no {PYTHON}"
    return None


pytestmark = pytest.mark.skipif(_can_run() is not None and not os.environ.get("CI"), reason=_can_run() or "")


@pytest.fixture
def data_dir() -> Iterator[Path]:
    """A data folder the job's user can pass through (pytest's own temporary folders are 0700 root)."""
    folder = Path(tempfile.mkdtemp(prefix="shardctl-run-as-", dir="/tmp"))
    folder.chmod(0o711)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def wait(backend: LocalBackend, handle: Handle) -> RunState:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        state = backend.poll([handle])[handle.name].state
        if state in (RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED):
            return state
        time.sleep(0.1)
    raise AssertionError("the job did not end")


PROBE = """
import json, os, pathlib
seen = {"uid": os.getuid(), "groups": os.getgroups()}
for name, path in (("request", "../request.json"), ("secret", os.environ["PROBE_SECRET"]),
                   ("parent_env", f"/proc/{os.getppid()}/environ")):
    try:
        pathlib.Path(path).read_bytes()
        seen[name] = "read"
    except OSError as exc:
        seen[name] = type(exc).__name__
pathlib.Path(os.environ["SHARDCTL_CHECKPOINT_DIR"], "step-1").write_text("ok")
pathlib.Path("result.json").write_text(json.dumps(seen))
print("probe done", flush=True)
"""


def test_a_job_run_as_another_user_reads_nothing_of_the_servers(data_dir: Path) -> None:
    secret = data_dir / "server-secret"
    secret.write_text("the server's database password")
    secret.chmod(0o600)
    backend = LocalBackend(data_dir / "local", run_as=USER)
    req = launch_request("shardctl-3-1", [PYTHON, "-c", PROBE], job_id=3, user_env={"PROBE_SECRET": str(secret)})
    handle = backend.submit(req)
    assert wait(backend, handle) == RunState.SUCCEEDED, backend.poll([handle])[handle.name]
    attempt = data_dir / "local" / "shardctl-3-1"
    seen = json.loads((attempt / "out" / "result.json").read_text())
    nobody = pwd.getpwnam(USER)
    assert seen["uid"] == nobody.pw_uid and 0 not in seen["groups"]
    assert seen["request"] == "PermissionError" and seen["secret"] == "PermissionError"
    assert seen["parent_env"] == "PermissionError"  # the supervisor is root's
    assert (data_dir / "local" / "checkpoints" / "job-3" / "step-1").read_text() == "ok"
    assert "probe done" in (attempt / "node0.log").read_text()
    assert (attempt / "request.json").stat().st_uid == 0 and (attempt / "request.json").stat().st_mode & 0o077 == 0


def test_a_user_that_cannot_reach_the_runs_folder_is_refused_with_the_fix(tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    with pytest.raises(ValueError, match="cannot reach the runs folder") as refused:
        LocalBackend(private / "local", run_as=USER)
    assert "SHARDCTL_DATA_DIR" in str(refused.value)
    with pytest.raises(ValueError, match="no OS user"):
        LocalBackend(tmp_path / "local", run_as="no-such-user-here")
    with pytest.raises(ValueError, match="is root"):
        LocalBackend(tmp_path / "local", run_as="root")
