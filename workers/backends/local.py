"""The embedded default backend: `torchrun` process groups on this machine.

Each attempt lives in `<folder>/<name>/`: `request.json`, `state.json` (supervisor pid), one log per
simulated node, the job's `out/` directory (its working folder), its own `home/` (HOME and the XDG
folders point there, never at the server's) and, at the end, `exit.json`. All of it is created
owner-only (folders 0700, files 0600): `request.json` holds the job token and the spec's env. Jobs
run as the server's OS user: see docs/security.md for what that does and does not isolate. A detached supervisor
(`local_supervisor`) owns the processes, so the service may restart without killing them, and the
folder's atomic rename is the one claim on the name: the same name is never run twice.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from service.jobenv import PLAN, REVEAL
from service.redaction import REDACTED, is_secret_env
from workers.backends.base import Handle, LaunchRequest, Observation, Rendered, RunState, SubmissionRefused
from workers.backends.local_supervisor import (
    job_environment,
    node_commands,
    open_private_log,
    supervisor_environment,
    write_private,
)

LOG_TAIL_LINES = 30
START_GRACE_S = 30.0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped by its parent) still answers kill(0); /proc tells.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][:1] != "Z"
    except OSError:
        return True


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            data = fh.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


class LocalBackend:
    """Processes on this host; `nodes` > 1 runs one torchrun agent per simulated node."""

    name = "local"

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)

    def _dir(self, name: str) -> Path:
        return self.folder / name

    def render(self, req: LaunchRequest) -> Rendered:
        """What `submit` starts: the folder, one command per simulated node and the environment they get
        (secret names redacted; `launch_preview` redacts credentials by value for every backend; the
        plan, which is the job's stored plan, left out for length)."""
        final = self._dir(req.name)
        per_node = node_commands(req, "127.0.0.1:<free port>")
        env = {k: REDACTED if is_secret_env(k) else v for k, v in job_environment(req, final).items() if k != PLAN}
        return Rendered(backend=self.name, name=req.name, content={
            "folder": str(final), "nodes": req.nodes, "commands": per_node, "env": env})

    def submit(self, req: LaunchRequest) -> Handle:
        """Start the attempt unless its folder already exists (then adopt it). Returns once the
        supervisor has claimed the name, or raises if it could not start."""
        final = self._dir(req.name)
        if final.exists():
            return Handle(name=req.name, backend_id=req.name)
        tmp = self.folder / f".{req.name}.{uuid.uuid4().hex[:8]}"
        tmp.mkdir(mode=0o700)  # owner only, whatever the umask: it holds the job token
        write_private(tmp / "request.json", req.model_dump_json(context=REVEAL))  # the supervisor runs the job
        log = open_private_log(self.folder / f".{req.name}.supervisor.log")
        try:
            subprocess.Popen([sys.executable, "-m", "workers.backends.local_supervisor", str(tmp), str(final)],
                             start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=log, env=supervisor_environment())
        finally:
            os.close(log)
        deadline = time.monotonic() + START_GRACE_S
        while time.monotonic() < deadline:
            if final.exists():
                return Handle(name=req.name, backend_id=req.name)
            time.sleep(0.02)
        raise SubmissionRefused(f"the local supervisor for {req.name} did not start within {START_GRACE_S:.0f} s;"
                                f" see {self.folder / f'.{req.name}.supervisor.log'}")

    def find(self, name: str) -> Handle | None:
        return Handle(name=name, backend_id=name) if self._dir(name).exists() else None

    def poll(self, handles: Sequence[Handle]) -> dict[str, Observation]:
        return {h.name: self._observe(h.name) for h in handles}

    def _observe(self, name: str) -> Observation:
        folder = self._dir(name)
        if not folder.exists():
            return Observation(state=RunState.MISSING)
        try:
            req = LaunchRequest.model_validate_json((folder / "request.json").read_text())
            nodes = [f"{socket.gethostname()}/node{rank}" for rank in range(req.nodes)]
        except (OSError, ValueError):
            nodes = []
        exit_file, state_file = folder / "exit.json", folder / "state.json"
        if exit_file.exists():
            result = json.loads(exit_file.read_text())
            if result.get("cancelled"):
                return Observation(state=RunState.CANCELLED, nodes=nodes, failure="cancelled",
                                   exit_code=result["exit_code"], reason="cancelled")
            if result["exit_code"] == 0:
                return Observation(state=RunState.SUCCEEDED, nodes=nodes, exit_code=0)
            return Observation(state=RunState.FAILED, nodes=nodes, exit_code=result["exit_code"], failure="program",
                               reason=f"exit code {result['exit_code']}", log_tail=self._tail(folder, len(nodes)))
        if not state_file.exists():
            return Observation(state=RunState.PENDING)
        state = json.loads(state_file.read_text())
        if _alive(int(state["pid"])):
            return Observation(state=RunState.RUNNING, nodes=nodes)
        if (folder / "cancel.flag").exists():
            return Observation(state=RunState.CANCELLED, nodes=nodes, failure="cancelled", reason="cancelled")
        return Observation(state=RunState.FAILED, nodes=nodes, failure="lost",
                           reason="the local supervisor died without recording an exit code",
                           log_tail=self._tail(folder, len(nodes)))

    def _tail(self, folder: Path, node_count: int) -> str:
        parts = []
        for rank in range(max(1, node_count)):
            text = tail(folder / f"node{rank}.log")
            if text:
                parts.append(f"[node{rank}]\n{text}")
        return "\n".join(parts)[-8000:]

    def cancel(self, handle: Handle) -> None:
        folder = self._dir(handle.name)
        if not folder.exists() or (folder / "exit.json").exists():
            return
        (folder / "cancel.flag").touch(mode=0o600)
        state_file = folder / "state.json"
        if state_file.exists():
            pgid = int(json.loads(state_file.read_text())["pgid"])
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGTERM)
