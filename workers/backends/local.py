"""The embedded default backend: `torchrun` process groups on this machine.

Each attempt lives in `<folder>/<name>/`: `request.json`, `state.json` (supervisor pid), one log per
simulated node, the job's `out/` directory (its working folder), its own `home/` (HOME and the XDG
folders point there, never at the server's), `devices.json` (what it holds: `local_devices`),
`preempt.json` once it is preempted (`local_preemption`) and, at the end, `exit.json`. Checkpoints
live per job, in `<folder>/checkpoints/job-<id>/`, so the attempt after a preemption resumes. All of it is created
owner-only (folders 0700, files 0600): `request.json` holds the job token and the spec's env. Jobs
run as the server's OS user: see docs/security.md for what that does and does not isolate. A detached supervisor
(`local_supervisor`) owns the processes, so the service may restart without killing them, and the
folder's atomic rename is the one claim on the name: the same name is never run twice.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from service.jobenv import PLAN, REVEAL
from service.redaction import REDACTED, is_secret_env
from workers.backends import evidence, jobfiles, local_devices, local_logs, local_preemption, local_strays
from workers.backends.base import (
    ArtifactInfo,
    FailureClass,
    Handle,
    LaunchRequest,
    LogChunk,
    Observation,
    Rendered,
    RunState,
    SubmissionRefused,
)
from workers.backends.local_supervisor import (
    INHERITED,
    PASS_THROUGH,
    RunAs,
    job_checkpoint_dir,
    job_environment,
    node_commands,
    open_private_log,
    supervisor_environment,
    write_private,
)

LOG_TAIL_LINES = 30
_ENDED = frozenset({RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED})
START_GRACE_S = 30.0


def _log_end(path: Path, size: int = 64 * 1024) -> str:
    """The last `size` bytes of a log as text ("" when it cannot be read: `jobfiles`)."""
    try:
        return jobfiles.read_end(path, size).decode(errors="replace")
    except OSError:
        return ""


def _json(path: Path) -> Any:
    """A JSON state file of the attempt folder (`jobfiles`: the job can replace it with anything)."""
    return json.loads(jobfiles.read_small_text(path))


#: What a preview shows in place of the server's runs folder, and of a value inherited from its environment.
RUNS_SHOWN = "<runs>"
INHERITED_SHOWN = "<inherited>"


def _replaced(data: Any, old: str, new: str) -> Any:
    """`data` (JSON-like) with `old` replaced by `new` in every string."""
    if isinstance(data, str):
        return data.replace(old, new)
    if isinstance(data, dict):
        return {k: _replaced(v, old, new) for k, v in data.items()}
    if isinstance(data, list):
        return [_replaced(v, old, new) for v in data]
    return data


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(_log_end(path).splitlines()[-lines:])


class LocalBackend:
    """Processes on this host; `nodes` > 1 runs one torchrun agent per simulated node."""

    name = "local"

    def __init__(self, folder: Path, devices: local_devices.LocalDevices | None = None, *,
                 run_as: str | None = None) -> None:
        """`devices`: what attempts may hold (`local_devices`: disjoint `CUDA_VISIBLE_DEVICES`, CPU
        affinity on the `cpu` kind; an attempt that does not fit now is a `TransientBackendError`).
        None: no device accounting, every attempt starts and inherits the server's devices.
        `run_as`: the OS user every job runs as (`local_supervisor.RunAs`; `ValueError` saying what to
        fix when it cannot be used); None: the server's own user."""
        self.folder = folder
        self.devices = devices
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.run_as = None if run_as is None else RunAs.of(run_as)
        if self.run_as is not None:
            os.chmod(self.folder, PASS_THROUGH)
            blocked = self.run_as.can_reach(self.folder)
            if blocked is not None:
                raise ValueError(f"SHARDCTL_LOCAL_RUN_AS={run_as}: that user cannot reach the runs folder"
                                 f" {self.folder}: {blocked} is not passable for it (mode"
                                 f" {oct(blocked.stat().st_mode & 0o777)}); give it o+x, or set SHARDCTL_DATA_DIR"
                                 " to a folder such as /var/lib/shardctl")

    def _dir(self, name: str) -> Path:
        return self.folder / name

    def render(self, req: LaunchRequest) -> Rendered:
        """What `submit` starts: the folder, one command per simulated node and the environment they get
        (secret names redacted; `launch_preview` redacts credentials by value for every backend; the
        plan, which is the job's stored plan, left out for length). The server's own paths are not
        shown: the runs folder reads `<runs>` and what the job inherits from the server's environment
        (`PATH`, `PYTHONPATH`...) reads `<inherited>`."""
        final = self._dir(req.name)
        per_node = node_commands(req, "127.0.0.1:<free port>", final)
        env = {k: REDACTED if is_secret_env(k) else INHERITED_SHOWN if k in INHERITED else v
               for k, v in job_environment(req, final).items() if k != PLAN}
        content = {"folder": str(final), "nodes": req.nodes, "commands": per_node, "env": env}
        return Rendered(backend=self.name, name=req.name, content=_replaced(content, str(self.folder), RUNS_SHOWN))

    def submit(self, req: LaunchRequest) -> Handle:
        """Start the attempt unless its folder already exists (then adopt it). Returns once the
        supervisor has claimed the name, or raises if it could not start."""
        final = self._dir(req.name)
        if final.exists():
            return Handle(name=req.name, backend_id=req.name)
        tmp = self.folder / f".{req.name}.{uuid.uuid4().hex[:8]}"
        tmp.mkdir(mode=0o700)  # owner only, whatever the umask: it holds the job token
        write_private(tmp / "request.json", req.model_dump_json(context=REVEAL))  # the supervisor runs the job
        if self.devices is not None:
            try:  # under the device lock: nothing else hands these out until this attempt has ended
                local_devices.claim(self.folder, tmp, req, self.devices)
            except Exception:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        log = open_private_log(self.folder / f".{req.name}.supervisor.log")
        try:
            subprocess.Popen([sys.executable, "-m", "workers.backends.local_supervisor", str(tmp), str(final),
                              *([self.run_as.name] if self.run_as is not None else [])],
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
        """Each attempt's state. An attempt found `lost` (its supervisor died) has whatever of it still
        runs stopped now (`local_strays`), so that its retry never runs beside it."""
        out = {}
        for h in handles:
            out[h.name] = obs = self._observe(h.name)
            if obs.failure == FailureClass.LOST:
                self._stop_strays(h.name)
        return out

    def _stop_strays(self, name: str) -> None:
        req = local_logs.read_request(self._dir(name))
        if req is None:
            return
        local_strays.kill(local_strays.processes(job_checkpoint_dir(self.folder, req.job_id), attempt=req.job.attempt))

    def _observe(self, name: str) -> Observation:
        folder = self._dir(name)
        if not folder.exists():
            return Observation(state=RunState.MISSING)
        req = local_logs.read_request(folder)
        nodes = [] if req is None else [f"{socket.gethostname()}/node{rank}" for rank in range(req.nodes)]
        exit_file, state_file = folder / "exit.json", folder / "state.json"
        if exit_file.exists():
            try:
                result = _json(exit_file)
                int(result["exit_code"])
            except (OSError, ValueError, TypeError, KeyError):
                return Observation(state=RunState.FAILED, nodes=nodes, failure=FailureClass.LOST,
                                   reason="the attempt's exit record is unreadable (exit.json)")
            if result.get("cancelled"):
                return Observation(state=RunState.CANCELLED, nodes=nodes, failure=FailureClass.CANCELLED,
                                   exit_code=result["exit_code"], reason="cancelled")
            if result.get("launch_error"):
                return Observation(state=RunState.FAILED, nodes=nodes, failure=FailureClass.LAUNCH_ERROR,
                                   reason=str(result["launch_error"]))
            if result.get("timed_out"):  # the supervisor stopped it at the spec's backend.time_limit
                return Observation(state=RunState.FAILED, nodes=nodes, exit_code=result["exit_code"],
                                   failure=FailureClass.TIMEOUT, log_tail=self._tail(folder, len(nodes)) or None,
                                   reason=f"time limit reached ({result.get('time_limit_s')} s, backend.time_limit)")
            if result["exit_code"] == 0:
                return Observation(state=RunState.SUCCEEDED, nodes=nodes, exit_code=0)
            if result.get("preempted"):  # local_preemption: stopped with notice; the job resumes elsewhere
                return Observation(state=RunState.FAILED, nodes=nodes, exit_code=result["exit_code"],
                                   failure=FailureClass.PREEMPTED,
                                   reason=f"preempted (exit code {result['exit_code']})",
                                   log_tail=self._tail(folder, len(nodes)) or None)
            return self._failed(folder, nodes, result)
        if not state_file.exists():
            return Observation(state=RunState.PENDING)
        try:
            pid = int(_json(state_file)["pid"])
        except (OSError, ValueError, TypeError, KeyError):
            return Observation(state=RunState.PENDING)  # being written, or replaced by the job: read again
        if local_strays.alive(pid):
            return Observation(state=RunState.RUNNING, nodes=nodes)
        if (folder / "cancel.flag").exists():
            return Observation(state=RunState.CANCELLED, nodes=nodes, failure=FailureClass.CANCELLED,
                               reason="cancelled")
        return Observation(state=RunState.FAILED, nodes=nodes, failure=FailureClass.LOST,
                           reason="the local supervisor died without recording an exit code",
                           log_tail=self._tail(folder, len(nodes)))

    def _failed(self, folder: Path, nodes: list[str], result: dict[str, Any]) -> Observation:
        """A run that exited non-zero, classified from its evidence (`docs/failures.md`): the program's
        own exit code (torchrun's failure summary in a node log; the process's own code when it ran
        alone), its own last lines, out-of-memory messages in them, and the OOM killer's count in this
        cgroup (`oom_kills`, recorded by the supervisor) for a SIGKILL."""
        logs = [_log_end(folder / f"node{rank}.log") for rank in range(max(1, len(nodes)))]
        code = next((c for c in map(evidence.root_cause_exit_code, logs) if c is not None), None)
        code = int(result["exit_code"]) if code is None else code
        tail_text = self._tail(folder, len(nodes))
        failure = evidence.memory_failure(tail_text)
        killed = evidence.signal_name(code)
        if failure is None and killed == "SIGKILL" and (result.get("oom_kills") or 0) > 0:
            failure, reason = FailureClass.OOM_HOST, f"killed by the kernel's OOM killer (SIGKILL, exit {code})"
        elif failure == FailureClass.OOM_GPU:
            reason = f"out of GPU memory (CUDA out of memory; exit code {code})"
        elif failure == FailureClass.OOM_HOST:
            reason = f"out of host memory (MemoryError; exit code {code})"
        else:
            failure = FailureClass.PROGRAM_ERROR
            reason = f"killed by {killed} (exit {code})" if killed and code < 0 else f"exit code {code}"
        return Observation(state=RunState.FAILED, nodes=nodes, exit_code=code, failure=failure, reason=reason,
                           log_tail=tail_text or None)

    def _tail(self, folder: Path, node_count: int) -> str:
        """The last `LOG_TAIL_LINES` lines each node's program printed (torchrun's own lines left out),
        headed `[node<n>]`; at most 8000 characters, the last ones."""
        parts = []
        for rank in range(max(1, node_count)):
            lines = evidence.program_lines(_log_end(folder / f"node{rank}.log").splitlines())[-LOG_TAIL_LINES:]
            if lines:
                parts.append(f"[node{rank}]\n" + "\n".join(lines))
        return "\n".join(parts)[-8000:]

    def cancel(self, handle: Handle) -> None:
        folder = self._dir(handle.name)
        if not folder.exists() or (folder / "exit.json").exists():
            return
        (folder / "cancel.flag").touch(mode=0o600)
        local_preemption.signal_supervisor(folder)

    def preempt(self, handle: Handle, grace_s: float) -> None:
        """SIGTERM to the attempt's supervisor now, which passes it on and SIGKILLs what is left after `grace_s`
        (`local_preemption`). Idempotent; the attempt then ends as `preempted`."""
        local_preemption.request(self._dir(handle.name), grace_s)

    # -- outputs (`base.LogReading`; `local_logs` reads the run folder) ---------------------------------
    def read_logs(self, handle: Handle, *, rank: int | None, cursor: str | None, limit: int) -> LogChunk:
        done = self._observe(handle.name).state in _ENDED  # first: nothing written before the end is missed
        return local_logs.read_logs(self._dir(handle.name), rank=rank, cursor=cursor, limit=limit, finished=done)

    def list_artifacts(self, handle: Handle) -> list[ArtifactInfo]:
        return local_logs.list_artifacts(self._dir(handle.name))

    def read_artifact(self, handle: Handle, path: str, *, max_bytes: int) -> bytes:
        return local_logs.read_artifact(self._dir(handle.name), path, max_bytes=max_bytes)
