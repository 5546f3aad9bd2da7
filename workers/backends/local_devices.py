"""Which devices of this machine each local attempt holds: disjoint sets, claimed under a file lock.

The local backend never starts more than the machine holds. Its devices (`LocalDevices`) are the
GPUs it detects (or is told of), and the CPUs this process may run on, one slot per core. An
attempt asks for `world_size * gpus_per_proc` GPUs, or on the `cpu` kind (`gpus_per_proc == 0`)
one CPU per process.

The allocation lives where everything else of the local backend lives, in the attempt folders:
each attempt's `devices.json` names what it holds. A claim (`claim`) takes an exclusive
`fcntl.flock` on `<folder>/.devices.lock`, reads every live attempt's `devices.json`, picks free
devices and writes the new attempt's file before it lets go, so two dispatchers (or threads) on
this machine never hand out the same device, and a restarted service sees the same allocation.

An attempt holds its devices while it is live: its folder has a `devices.json` and no `exit.json`,
and either its supervisor (`state.json`'s pid) is alive, or it has no `state.json` yet and its
`devices.json` is younger than the start grace (a supervisor starting). A supervisor that died
without an `exit.json` frees them (the attempt is reported `lost`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from workers.backends import jobfiles
from workers.backends.base import LaunchRequest, SubmissionRefused, TransientBackendError

DEVICES_FILE = "devices.json"
LOCK_FILE = ".devices.lock"
#: An attempt folder with a `devices.json` but no supervisor yet holds its devices this long.
START_GRACE_S = 60.0
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"


class LocalDevices(BaseModel):
    """What the local backend may hand out: GPU ids (as `CUDA_VISIBLE_DEVICES` names them) and CPU ids
    (as `os.sched_setaffinity` takes them). An empty `gpus` means this machine runs `cpu` jobs only."""

    model_config = ConfigDict(frozen=True)

    gpus: tuple[str, ...] = ()
    cpus: tuple[int, ...] = Field(default_factory=tuple)

    @classmethod
    def parse(cls, text: str) -> LocalDevices:
        """`SHARDCTL_LOCAL_DEVICES`: `gpu:0,1,2,3` (or just `0,1,2,3`), `cpu:0,1`, or both joined by
        `;` (`gpu:0,1;cpu:0-7`). CPU ids take ranges (`0-7`). A kind not named is detected."""
        gpus: tuple[str, ...] | None = None
        cpus: tuple[int, ...] | None = None
        for part in (p.strip() for p in text.split(";")):
            if not part:
                continue
            kind, _, ids = part.rpartition(":")
            kind = kind.strip().lower() or "gpu"
            names = [i.strip() for i in ids.split(",") if i.strip()]
            if kind == "gpu":
                gpus = tuple(names)
            elif kind == "cpu":
                cpus = tuple(_cpu_ids(names))
            else:
                raise ValueError(f"SHARDCTL_LOCAL_DEVICES: unknown device kind {kind!r} in {part!r}"
                                 " (write gpu:0,1 or cpu:0-3)")
        detected = cls.detect()
        return cls(gpus=detected.gpus if gpus is None else gpus, cpus=detected.cpus if cpus is None else cpus)

    @classmethod
    def detect(cls, environ: Mapping[str, str] | None = None) -> LocalDevices:
        """The GPUs this service may use ($CUDA_VISIBLE_DEVICES when set, else `nvidia-smi -L`; no torch
        import) and the CPUs it may run on (`os.sched_getaffinity`, else `os.cpu_count()`)."""
        source = os.environ if environ is None else environ
        visible = source.get(CUDA_VISIBLE_DEVICES)
        gpus = tuple(v.strip() for v in visible.split(",") if v.strip()) if visible is not None else nvidia_smi_gpus()
        try:
            cpus = tuple(sorted(os.sched_getaffinity(0)))
        except (AttributeError, OSError):
            cpus = tuple(range(os.cpu_count() or 1))
        return cls(gpus=gpus, cpus=cpus)


def _cpu_ids(names: list[str]) -> list[int]:
    out: list[int] = []
    for name in names:
        lo, sep, hi = name.partition("-")
        try:
            out.extend(range(int(lo), int(hi) + 1) if sep else [int(lo)])
        except ValueError as exc:
            raise ValueError(f"SHARDCTL_LOCAL_DEVICES: {name!r} is not a CPU id or range (0-3)") from exc
    return out


def nvidia_smi_gpus() -> tuple[str, ...]:
    """GPU indices from `nvidia-smi -L` ("GPU 0: NVIDIA H200 (UUID: ...)"); none without the tool."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return ()
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=20, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    return tuple(line.split(":", 1)[0].split()[1] for line in out.splitlines()
                 if line.startswith("GPU ") and ":" in line)


class Assignment(BaseModel):
    """What one attempt holds (`<attempt folder>/devices.json`)."""

    kind: Literal["gpu", "cpu"]
    devices: list[str] = Field(description="GPU ids, or CPU ids as strings, in rank order.")
    per_node: int = Field(description="Devices each simulated node gets (its slice of `devices`).")
    claimed_at: float

    def node_devices(self, node: int) -> list[str]:
        """The slice simulated node `node` sees (its local ranks index into it)."""
        return self.devices[node * self.per_node:(node + 1) * self.per_node]

    def node_environment(self, env: Mapping[str, str], node: int) -> dict[str, str]:
        """`env` with `CUDA_VISIBLE_DEVICES` replaced by this node's GPUs; empty on the `cpu` kind, so a CPU
        job sees no GPU (whatever the server was started with)."""
        visible = ",".join(self.node_devices(node)) if self.kind == "gpu" else ""
        return {**env, CUDA_VISIBLE_DEVICES: visible}

    def node_cpus(self, node: int) -> set[int] | None:
        """The CPUs simulated node `node`'s processes are pinned to (`cpu` kind), None for GPU jobs."""
        return {int(c) for c in self.node_devices(node)} if self.kind == "cpu" else None


def needed(req: LaunchRequest) -> tuple[Literal["gpu", "cpu"], int, int]:
    """(kind, devices in all, devices per node) of a request."""
    if req.gpus_per_proc > 0:
        return "gpu", req.world_size * req.gpus_per_proc, req.procs_per_node * req.gpus_per_proc
    return "cpu", req.world_size, req.procs_per_node


def read_assignment(attempt: Path) -> Assignment | None:
    """The attempt's `devices.json`, None when it has none (started without device accounting)."""
    try:
        return Assignment.model_validate_json(jobfiles.read_small_text(attempt / DEVICES_FILE))
    except (OSError, ValueError):
        return None


def _supervisor_alive(pid: int, started_at: float | None) -> bool:
    """Whether `pid` is still the attempt's supervisor: alive, not a zombie, and (when /proc tells) started
    no later than the supervisor recorded, so a pid reused after a reboot frees the devices."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
        if fields[0] == "Z":
            return False
        if started_at is not None:
            boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                        if line.startswith("btime "))
            began = boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
            return began <= started_at + 5.0
    except (OSError, IndexError, ValueError, StopIteration):
        pass
    return True


def holds(attempt: Path, now: float) -> Assignment | None:
    """The devices `attempt` holds now (see the module docstring), or None."""
    assignment = read_assignment(attempt)
    if assignment is None or (attempt / "exit.json").exists():
        return None
    state = attempt / "state.json"
    try:
        recorded = json.loads(jobfiles.read_small_text(state))
        pid, started_at = int(recorded["pid"]), recorded.get("started_at")
    except FileNotFoundError:
        return assignment if now - assignment.claimed_at < START_GRACE_S else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return assignment  # being written: count it, never hand its devices out twice
    return assignment if _supervisor_alive(pid, started_at) else None


def in_use(folder: Path, now: float | None = None) -> dict[str, set[str]]:
    """Every device held by a live attempt under `folder`, by kind."""
    now = time.time() if now is None else now
    used: dict[str, set[str]] = {"gpu": set(), "cpu": set()}
    for entry in folder.iterdir():
        if entry.is_dir():
            held = holds(entry, now)
            if held is not None:
                used[held.kind].update(held.devices)
    return used


@contextlib.contextmanager
def locked(folder: Path) -> Iterator[None]:
    """The backend folder's device lock (exclusive `flock`; released when the block ends or the process dies)."""
    fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def claim(folder: Path, attempt: Path, req: LaunchRequest, devices: LocalDevices) -> Assignment:
    """Pick free devices for `req` and write them to `attempt/devices.json`, all under the lock.

    Raises `SubmissionRefused` when the request can never fit (more than the machine has) and
    `TransientBackendError` when it does not fit now (the dispatcher tries again later)."""
    kind, count, per_node = needed(req)
    pool = list(devices.gpus) if kind == "gpu" else [str(c) for c in devices.cpus]
    if count > len(pool):
        what = f"{len(pool)} GPU(s)" if kind == "gpu" else f"{len(pool)} CPU slot(s)"
        raise SubmissionRefused(f"{req.name} needs {count} {kind} device(s); this machine's local backend has {what}"
                                f" ({'none detected' if not pool else ','.join(pool)}; set SHARDCTL_LOCAL_DEVICES)")
    with locked(folder):
        busy = in_use(folder)[kind]
        free = [d for d in pool if d not in busy]
        if len(free) < count:
            raise TransientBackendError(f"{req.name} needs {count} {kind} device(s); {len(free)} of {len(pool)}"
                                        " are free now (the rest are held by running attempts)")
        assignment = Assignment(kind=kind, devices=free[:count], per_node=per_node, claimed_at=time.time())
        fd = os.open(attempt / DEVICES_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(assignment.model_dump_json())
    return assignment
