"""Runs one local attempt, detached from the service:
`python -m workers.backends.local_supervisor TMP FINAL [RUN_AS]`.

It first claims the attempt by renaming TMP to FINAL (atomic; if FINAL exists another submission
already owns the name and this process exits without running anything). It then starts one
`torchrun` agent per simulated node, forwards SIGTERM to them, and writes `exit.json` when all
have finished. The service can restart at any time: the state is in the folder, not in memory.

With RUN_AS (an OS user; the supervisor runs as root) the job's processes run as that user: the folders
the job writes (out/, home/, its rank logs, its checkpoints) become the user's, the folders on the way
there are passed through but not listed (0711), and the rest of the attempt folder (request.json with
the job token, state.json, the node logs) stays the server's, 0600.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.backend_options import LocalOptions, time_limit_seconds
from service.jobenv import CHECKPOINT_DIR, PREEMPTED_EXIT_CODE
from workers.backends import local_devices, local_preemption, local_strays
from workers.backends.base import LOG_ENV, LaunchRequest, local_path_env, torchrun_command

#: What a local job inherits from the server's environment: enough to run Python and find devices,
#: never the server's own settings or credentials (SHARDCTL_DATABASE_URL, cloud keys...). HOME is
#: not inherited: each attempt has its own (`job_home`), so nothing the server user keeps under its
#: home (the CLI config with its token, cloud and git credentials) is found through HOME or XDG paths.
INHERITED = ("PATH", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "PYTHONPATH",
             "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
#: Files and folders a local attempt creates are its owner's only (0600 files, 0700 folders).
PRIVATE_UMASK = 0o077


def job_home(final: Path) -> Path:
    """The attempt's own HOME: a fresh folder inside the attempt folder, never the server's."""
    return final / "home"


def home_environment(home: Path) -> dict[str, str]:
    """HOME and the XDG base folders, all inside the attempt's own home."""
    return {"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"), "XDG_CACHE_HOME": str(home / ".cache"),
            "XDG_DATA_HOME": str(home / ".local" / "share"), "XDG_STATE_HOME": str(home / ".local" / "state")}


def job_environment(req: LaunchRequest, final: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment every process of the attempt gets: a few inherited variables, its own HOME and
    XDG folders, the user's entrypoint.env, and the job contract (`service.jobenv`) with `out/` as its
    output folder."""
    source = os.environ if base is None else base
    inherited = {k: source[k] for k in INHERITED if k in source}
    return local_path_env({**inherited, **home_environment(job_home(final)), **LOG_ENV,
                           **req.environment(out_dir=str(final / "out")),
                           CHECKPOINT_DIR: str(job_checkpoint_dir(final.parent, req.job_id))})


def job_checkpoint_dir(folder: Path, job_id: int) -> Path:
    """Where every attempt of job `job_id` keeps its checkpoints (`$SHARDCTL_CHECKPOINT_DIR`): one folder
    per job beside the attempt folders, so the attempt after a preemption resumes from the last one."""
    return folder / "checkpoints" / f"job-{job_id}"


def supervisor_environment(base: dict[str, str] | None = None) -> dict[str, str]:
    """What the supervisor itself runs with: the inherited allow-list only. It is the parent of the
    job's processes, and a process of the same user can read its parent's /proc/<pid>/environ."""
    source = os.environ if base is None else base
    return {k: source[k] for k in INHERITED if k in source}


def write_private(path: Path, data: str | bytes) -> None:
    """Create `path` (it must not exist) readable and writable by its owner only: the mode is set when
    the file is created (`os.open(..., 0o600)`), never afterwards."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data.encode() if isinstance(data, str) else data)


def open_private_log(path: Path) -> int:
    """A file descriptor appending to `path`, which is created 0600 if absent."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _write(path: Path, data: dict[str, object]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    write_private(tmp, json.dumps(data))
    tmp.replace(path)


def node_commands(req: LaunchRequest, endpoint: str, final: Path | None = None) -> list[list[str]]:
    """One torchrun agent per simulated node; a single process runs its command directly (torchrun
    would only add seconds of start-up), with the environment torchrun would have given it. With the
    attempt folder `final`, each agent tees its ranks' output into `final/ranks/node<n>/` and onto its
    node log behind a rank prefix (`local_logs` reads them)."""
    if req.world_size == 1:
        return [list(req.command)]
    return [torchrun_command(req, rdzv_endpoint=endpoint, node_rank=str(rank),
                             log_dir=None if final is None else str(rank_log_dir(final, rank)))
            for rank in range(req.nodes)]


def rank_log_dir(final: Path, node: int) -> Path:
    """Where node `node`'s torchrun keeps each local rank's own stdout and stderr files."""
    return final / "ranks" / f"node{node}"


def single_process_env(endpoint: str) -> dict[str, str]:
    host, port = endpoint.rsplit(":", 1)
    return {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "0",
            "ROLE_RANK": "0", "MASTER_ADDR": host, "MASTER_PORT": port}


@dataclass(frozen=True)
class RunAs:
    """The OS user a local attempt's processes run as, when it is not the server's own."""

    name: str
    uid: int
    gid: int

    @classmethod
    def of(cls, name: str) -> RunAs:
        """The account `name`; `ValueError` naming the fix when there is none, or when this process (not
        root) could not switch to it."""
        try:
            account = pwd.getpwnam(name)
        except KeyError:
            raise ValueError(f"SHARDCTL_LOCAL_RUN_AS: no OS user {name!r} on this machine; create it (useradd"
                             " --system --no-create-home NAME) or unset it") from None
        if account.pw_uid == 0:
            raise ValueError(f"SHARDCTL_LOCAL_RUN_AS: {name!r} is root; name an unprivileged user")
        if os.geteuid() != 0:
            raise ValueError(f"SHARDCTL_LOCAL_RUN_AS={name} needs the server to run as root, to start jobs as"
                             " that user; run serve/worker as root, or unset it")
        return cls(name=name, uid=account.pw_uid, gid=account.pw_gid)

    def can_reach(self, folder: Path) -> Path | None:
        """The first folder on the way to `folder` (itself included) that this user cannot pass through,
        or None when it can reach `folder`."""
        for part in [*reversed(folder.resolve().parents), folder.resolve()]:
            st = part.stat()
            bit = stat.S_IXUSR if st.st_uid == self.uid else stat.S_IXGRP if st.st_gid == self.gid else stat.S_IXOTH
            if not st.st_mode & bit:
                return part
        return None

    def give(self, *folders: Path) -> None:
        """Make `folders` the user's own (where the job writes: out/, home/, its rank logs, checkpoints)."""
        for folder in folders:
            os.chown(folder, self.uid, self.gid)


#: The mode of the folders a job run as another user passes through but may not list: the runs folder,
#: the attempt folder and the checkpoints folder (the attempt's request.json and state files stay 0600).
PASS_THROUGH = 0o711


def follow_sigterm(act: Callable[[], None]) -> list[int]:
    """Call `act` on a thread of its own once for each SIGTERM the process gets; returns the list the
    handler appends each one to, which the caller reads once its children have ended. The handler only
    does that and writes a byte to a pipe: `act` takes locks (a file read's thread pool, a timer's
    start), which a second SIGTERM arriving while the first one's `act` ran on the main thread found
    held, and the supervisor hung in its own handler with the job running on. An `act` that raises is
    printed to the supervisor's output and the next SIGTERM is still acted on."""
    received: list[int] = []
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)  # a full pipe already holds a wake-up: never block the handler

    def follow() -> None:
        while os.read(wake_read, 1):
            try:
                act()
            except Exception:
                traceback.print_exc()

    def handler(signum: int, _frame: object) -> None:
        received.append(signum)
        with contextlib.suppress(BlockingIOError):
            os.write(wake_write, b"t")

    threading.Thread(target=follow, name="sigterm", daemon=True).start()
    signal.signal(signal.SIGTERM, handler)
    return received


def main(tmp: Path, final: Path, run_as: RunAs | None = None) -> int:
    os.umask(PRIVATE_UMASK)  # what the supervisor and the job create is private too (logs, out/, home/)
    try:
        with local_devices.locked(final.parent):  # a device claim never sees the folder between two names
            os.rename(tmp, final)
    except OSError:
        return 3
    _write(final / "state.json", {"pid": os.getpid(), "pgid": os.getpgid(0), "started_at": time.time()})
    req = LaunchRequest.model_validate_json((final / "request.json").read_text())
    endpoint = f"127.0.0.1:{_free_port()}"
    env = job_environment(req, final)
    (final / "out").mkdir(mode=0o700, exist_ok=True)
    job_home(final).mkdir(mode=0o700, exist_ok=True)
    checkpoints = job_checkpoint_dir(final.parent, req.job_id)
    checkpoints.mkdir(mode=0o700, parents=True, exist_ok=True)
    if run_as is not None:
        for rank in range(req.nodes):
            rank_log_dir(final, rank).mkdir(mode=0o700, parents=True, exist_ok=True)
        for folder in (final, checkpoints.parent):
            os.chmod(folder, PASS_THROUGH)
        run_as.give(final / "out", job_home(final), final / "ranks", *final.joinpath("ranks").iterdir(), checkpoints)
    launch_error: str | None = None
    writer_lock: int | None = None
    try:  # nothing of an earlier attempt may run beside this one, nor write its checkpoints
        local_strays.stop_earlier(checkpoints, req.job.attempt)
        writer_lock = local_strays.hold_writer_lock(checkpoints)
    except TimeoutError as exc:
        launch_error = f"an earlier attempt of this job could not be stopped: {exc}"
    devices = local_devices.read_assignment(final)  # None: started without device accounting
    preempted_early = local_preemption.requested(final) is not None  # told to stop before anything started
    children: list[subprocess.Popen[bytes]] = []
    cancelled = False

    # Each child gets one SIGTERM: torchrun's agent exits at once on a second, and the ranks it leaves
    # behind are no longer this process's to kill. The first goes to the whole process group, which
    # reaches what a child started in it too (a shell script's program).
    signalled: set[int] = set()
    armed = grouped = False
    term_lock = threading.Lock()  # the SIGTERM thread's and the main thread's calls

    def on_term() -> None:
        nonlocal cancelled, armed, grouped
        with term_lock:
            if local_preemption.requested(final) is None:
                cancelled = True
            elif not armed:  # a preemption: SIGKILL what still runs when the grace period is over
                armed = True
                local_preemption.arm_deadline(final)
            if not grouped and children:
                grouped = True
                signalled.update(child.pid for child in children)
                os.killpg(0, signal.SIGTERM)  # this process's own comes back to `on_term`: nothing left to do
            for child in children:
                if child.pid not in signalled and child.poll() is None:
                    signalled.add(child.pid)
                    child.terminate()

    terms = follow_sigterm(on_term)
    oom_before = oom_kill_count()
    start = not preempted_early and launch_error is None
    inherited_lock = () if writer_lock is None else (writer_lock,)  # the agents hold the lock as long as they run
    for rank, command in enumerate(node_commands(req, endpoint, final) if start else []):
        if cancelled or (final / "cancel.flag").exists():
            # cancelled while the nodes were starting: start no more (on_term stopped those already started)
            on_term()
            break
        log = open_private_log(final / f"node{rank}.log")
        node_env = env if req.world_size > 1 else {**env, **single_process_env(endpoint)}
        if devices is not None:
            node_env = devices.node_environment(node_env, rank)
        try:
            children.append(subprocess.Popen(command, cwd=final / "out", env=node_env, stdout=log,
                                             stderr=subprocess.STDOUT, pass_fds=inherited_lock,
                                             preexec_fn=_pin(devices.node_cpus(rank) if devices else None),
                                             **_account(run_as)))
        except OSError as exc:  # exec refused it (E2BIG, ENOENT, EACCES): a launch error, reported as such
            launch_error = f"node{rank} could not start {command[0]!r}: {exc}"
            os.write(log, f"shardctl: {launch_error}\n".encode())
            break
        finally:
            os.close(log)  # the child holds its own copy
    if launch_error is not None and children:  # the nodes that did start would wait for the missing one
        on_term()
    limit = TimeLimit(req, children)
    codes = [child.wait() for child in children] if not preempted_early else [PREEMPTED_EXIT_CODE]
    exit_code = next((c for c in codes if c != 0), 0)
    limit.cancel()
    if terms and local_preemption.requested(final) is None:  # a SIGTERM its thread has not acted on yet
        cancelled = True
    cancelled = (cancelled and launch_error is None) or (final / "cancel.flag").exists()
    _write(final / "exit.json", {"exit_code": exit_code, "codes": codes, "cancelled": cancelled,
                                 "finished_at": time.time(), "launch_error": launch_error,
                                 "oom_kills": oom_kills_since(oom_before), "time_limit_s": limit.seconds,
                                 "timed_out": limit.reached and not cancelled,
                                 "preempted": not cancelled and not limit.reached  # a time limit's SIGTERM
                                 and local_preemption.ended_preempted(final, codes)})  # is not a preemption
    return 0


def _account(run_as: RunAs | None) -> dict[str, Any]:
    """`Popen`'s arguments that start a process as `run_as` (its user, its group, no other group)."""
    return {} if run_as is None else {"user": run_as.uid, "group": run_as.gid, "extra_groups": []}


def _pin(cpus: set[int] | None) -> Callable[[], None] | None:
    """A `preexec_fn` that pins the child (and all it starts) to `cpus`; None when there is nothing to pin."""
    if not cpus:
        return None

    def pin() -> None:
        os.sched_setaffinity(0, cpus)

    return pin


class TimeLimit:
    """The spec's `backend.time_limit` (`LocalOptions`), enforced: when it passes with a node still
    running, every node gets SIGTERM, and SIGKILL `grace_s` later; `reached` says it happened."""

    def __init__(self, req: LaunchRequest, children: list[subprocess.Popen[bytes]], grace_s: float = 10.0) -> None:
        options = req.options
        self.seconds = (time_limit_seconds(options.time_limit)
                        if isinstance(options, LocalOptions) and options.time_limit else None)
        self.children, self.grace_s, self.reached = children, grace_s, False
        self._timer = threading.Timer(self.seconds, self._stop) if self.seconds and children else None
        if self._timer is not None:
            self._timer.daemon = True
            self._timer.start()

    def _stop(self) -> None:
        running = [c for c in self.children if c.poll() is None]
        if not running:
            return
        self.reached = True
        for child in running:
            child.terminate()
        deadline = time.monotonic() + self.grace_s
        while time.monotonic() < deadline and any(c.poll() is None for c in running):
            time.sleep(0.1)
        for child in running:
            if child.poll() is None:
                child.kill()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()


def oom_kill_count() -> int | None:
    """How many processes the kernel's OOM killer has killed in this process's memory cgroup (cgroup v2
    `memory.events`, v1 `memory.oom_control`: the `oom_kill` line); None where it cannot be read."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2 (unified)
            candidates = [Path("/sys/fs/cgroup") / path.lstrip("/") / "memory.events"]
        elif "memory" in controllers.split(","):  # v1
            candidates = [Path("/sys/fs/cgroup/memory") / path.lstrip("/") / "memory.oom_control"]
        else:
            continue
        for candidate in candidates:
            try:
                for entry in candidate.read_text().splitlines():
                    key, _, value = entry.partition(" ")
                    if key == "oom_kill" and value.strip().isdigit():
                        return int(value)
            except OSError:
                continue
    return None


def oom_kills_since(before: int | None) -> int | None:
    """OOM kills in this cgroup since `before` was read (`oom_kill_count`); None when unknown."""
    after = oom_kill_count()
    return None if before is None or after is None else max(0, after - before)


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2]), RunAs.of(sys.argv[3]) if len(sys.argv) > 3 else None))
