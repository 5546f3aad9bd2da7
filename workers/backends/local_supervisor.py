"""Runs one local attempt, detached from the service: `python -m workers.backends.local_supervisor TMP FINAL`.

It first claims the attempt by renaming TMP to FINAL (atomic; if FINAL exists another submission
already owns the name and this process exits without running anything). It then starts one
`torchrun` agent per simulated node, forwards SIGTERM to them, and writes `exit.json` when all
have finished. The service can restart at any time: the state is in the folder, not in memory.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

from workers.backends.base import LaunchRequest, local_path_env, torchrun_command

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
    return local_path_env({**inherited, **home_environment(job_home(final)),
                           **req.environment(out_dir=str(final / "out"))})


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


def node_commands(req: LaunchRequest, endpoint: str) -> list[list[str]]:
    """One torchrun agent per simulated node; a single process runs its command directly (torchrun
    would only add seconds of start-up), with the environment torchrun would have given it."""
    if req.world_size == 1:
        return [list(req.command)]
    return [torchrun_command(req, rdzv_endpoint=endpoint, node_rank=str(rank)) for rank in range(req.nodes)]


def single_process_env(endpoint: str) -> dict[str, str]:
    host, port = endpoint.rsplit(":", 1)
    return {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "0",
            "ROLE_RANK": "0", "MASTER_ADDR": host, "MASTER_PORT": port}


def main(tmp: Path, final: Path) -> int:
    os.umask(PRIVATE_UMASK)  # what the supervisor and the job create is private too (logs, out/, home/)
    try:
        os.rename(tmp, final)
    except OSError:
        return 3
    _write(final / "state.json", {"pid": os.getpid(), "pgid": os.getpgid(0), "started_at": time.time()})
    req = LaunchRequest.model_validate_json((final / "request.json").read_text())
    endpoint = f"127.0.0.1:{_free_port()}"
    env = job_environment(req, final)
    (final / "out").mkdir(mode=0o700, exist_ok=True)
    job_home(final).mkdir(mode=0o700, exist_ok=True)
    children: list[subprocess.Popen[bytes]] = []
    cancelled = False

    def on_term(_signum: int, _frame: FrameType | None) -> None:
        nonlocal cancelled
        cancelled = True
        for child in children:
            if child.poll() is None:
                child.terminate()

    signal.signal(signal.SIGTERM, on_term)
    for rank, command in enumerate(node_commands(req, endpoint)):
        log = open_private_log(final / f"node{rank}.log")
        node_env = env if req.world_size > 1 else {**env, **single_process_env(endpoint)}
        try:
            children.append(subprocess.Popen(command, cwd=final / "out", env=node_env, stdout=log,
                                             stderr=subprocess.STDOUT))
        finally:
            os.close(log)  # the child holds its own copy
    codes = [child.wait() for child in children]
    exit_code = next((c for c in codes if c != 0), 0)
    cancelled = cancelled or (final / "cancel.flag").exists()
    _write(final / "exit.json", {"exit_code": exit_code, "codes": codes, "cancelled": cancelled,
                                 "finished_at": time.time()})
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
