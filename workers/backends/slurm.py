"""The Slurm backend: one attempt = one sbatch job submitted through `submitit`.

Shape of a submission (see docs/slurm.md):

- Slurm job name = `req.name` (`shardctl-<job id>-<attempt>`), so `find(name)` adopts after a crash.
- `--nodes=req.nodes --ntasks-per-node=1`: one task per node, which is one `torchrun` agent. Each task runs
  `NodeLauncher` (pickled by submitit into `<folder>/<name>/`), which starts
  `torchrun_command(req, rdzv_endpoint=<first host of SLURM_JOB_NODELIST>:<port>)` and exits with the
  failing program's own exit code (taken from torchrun's failure report) so `sacct` shows it.
- CPUs per task, GPUs per node (`procs_per_node * gpus_per_proc` when > 0), partition, account, QOS and
  time limit come from the spec's backend options; extra `sbatch` flags replace submitit's value of that
  parameter or become `additional_parameters`. The job runs in `--chdir=<folder>/<name>`, which is how
  `find` tells this backend's jobs from others of the same name.
- Status: `poll(handles)` runs ONE `sacct` for all handles (plus at most one `squeue` for jobs that
  `sacct` does not know yet or still shows as pending/running: slurmdbd lags the controller).
- Preemption: submitit's signal then requeue. The launcher is `Checkpointable`: on `USR2` before the time
  limit (a preemption notice, or `scancel --signal=USR2`), submitit checkpoints it and runs
  `scontrol requeue`; a partition preemption (`PreemptMode=REQUEUE`) requeues the job in Slurm itself.
  Either way the job keeps its id and name; `poll` reads `sacct --duplicates` and reports the number of
  requeues with their reasons in `SlurmObservation.requeues` / `requeue_reasons`. Near the time limit
  the launcher ignores submitit's `USR2` so Slurm ends the job as `TIMEOUT` (not requeued, not FAILED).

Every CLI call goes through `SlurmBackend._run`, which counts calls per command in `self.calls` and
turns an unreachable controller/database into `BackendUnavailable`.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, ClassVar

import submitit
from pydantic import BaseModel, ConfigDict, Field, field_validator
from submitit.core.utils import DelayedSubmission
from submitit.slurm.slurm import _make_sbatch_string

from workers.backends.base import (
    OUT_ENV,
    PLAN_ENV,
    REDACTED,
    BackendUnavailable,
    Capabilities,
    FailureClass,
    Handle,
    LaunchRequest,
    Observation,
    Rendered,
    RunState,
    is_secret_env,
    torchrun_command,
)

#: stderr fragments that mean "Slurm did not answer", not "this request is wrong".
_UNREACHABLE = re.compile(
    r"Unable to contact slurm controller|Socket timed out|Connection refused|Connection timed out"
    r"|Unable to establish|slurmdbd.*(not|un)|Problem talking to the database|Zero Bytes were transmitted"
    r"|Could not establish a configuration source|Transport endpoint",
    re.IGNORECASE,
)
_SBATCH_FLAG = re.compile(r"^--([a-z][a-z0-9-]*)(?:=(.*))?$", re.DOTALL)
_TIME_LIMIT = re.compile(r"^(?:(\d+)-)?(\d{1,2}):(\d{2})(?::(\d{2}))?$")
_EXITCODE_IN_TORCHRUN_REPORT = re.compile(r"exitcode\s*:\s*(-?\d+)")
_SACCT_FIELDS = ("JobIDRaw", "JobName", "State", "ExitCode", "NodeList", "Reason", "WorkDir", "NNodes")
_SQUEUE_FORMAT = "%i|%j|%T|%N|%r|%Z|%D"
LOG_TAIL_LINES = 30
#: terminal Slurm states that are failures -> (failure class, words for the reason)
_FAILED_STATES: dict[str, tuple[FailureClass, str]] = {
    "FAILED": ("program", "the program failed"),
    "OUT_OF_MEMORY": ("program", "out of memory"),
    "TIMEOUT": ("timeout", "time limit reached"),
    "DEADLINE": ("timeout", "deadline reached"),
    "NODE_FAIL": ("node", "node failure"),
    "BOOT_FAIL": ("node", "node boot failure"),
    "PREEMPTED": ("preempted", "preempted (not requeued)"),
}


class SlurmSubmitError(RuntimeError):
    """sbatch answered and refused the request (bad partition, QOS, flag...): a verdict, not an outage."""


class SlurmOptions(BaseModel):
    """The spec's `backend` options that this backend reads (boundary model; other backends' keys ignored)."""

    model_config = ConfigDict(extra="ignore")

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time_limit: str | None = Field(None, description="Slurm time: [D-]HH:MM[:SS].")
    sbatch: list[str] = Field(default_factory=list, description="Extra long sbatch flags: --flag or --flag=value.")

    @field_validator("time_limit")
    @classmethod
    def _time(cls, value: str | None) -> str | None:
        if value is not None and not _TIME_LIMIT.match(value):
            raise ValueError("time_limit must look like 02:00:00 or 1-12:00:00")
        return value

    @field_validator("sbatch")
    @classmethod
    def _flags(cls, flags: list[str]) -> list[str]:
        for flag in flags:
            match = _SBATCH_FLAG.match(flag)
            if not match:
                raise ValueError(f"sbatch flag {flag!r}: use the long form --name or --name=value")
            if match.group(1) in _RESERVED_FLAGS:
                raise ValueError(f"sbatch flag {flag!r}: shardctl sets --{match.group(1)} itself (use the spec's "
                                 "nodes, partition, account, qos or time_limit)")
        return flags


_WAITING = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "CONFIGURING"})
_RUNNING = frozenset({"RUNNING", "COMPLETING", "SUSPENDED", "STAGE_OUT", "SIGNALING", "RESIZING", "STOPPED"})
#: Slurm states in which a job is not finished: squeue's view of these beats sacct's (which lags)
_LIVE = _WAITING | _RUNNING


def _fuller(accounted: str, current: str) -> str:
    """The longer of sacct's and squeue's node lists (sacct's on a tie). Each is short for a moment:
    squeue drops each node that has finished its epilog while a job completes, and sacct first
    records a just-finished job on its batch host alone (NNodes already says how many it had)."""
    return current if len(expand_nodelist(current)) > len(expand_nodelist(accounted)) else accounted


def _nodes_complete(rec: dict[str, str]) -> bool:
    """The record lists as many nodes as it says the job had (NNodes). A job that never got nodes
    (`None assigned`) or an unknown count is complete: only a partly recorded list is not."""
    count, nodes = rec.get("NNodes", ""), expand_nodelist(rec["NodeList"])
    return not count.isdigit() or not nodes or len(nodes) >= int(count)


#: sbatch flags the backend sets itself: a spec may not override them (use the spec's own fields instead)
_RESERVED_FLAGS = frozenset({"job-name", "nodes", "ntasks-per-node", "ntasks", "time", "output", "error",
                             "signal", "open-mode", "partition", "account", "qos", "array", "wrap", "chdir"})


def _submitit_parameter_names() -> frozenset[str]:
    """Parameter names submitit's sbatch writer accepts (Slurm names with underscores)."""
    return frozenset(inspect.signature(_make_sbatch_string).parameters) - {"command", "folder", "map_count"}


class SlurmObservation(Observation):
    """An `Observation` plus what only Slurm knows: the job id and how often Slurm requeued it."""

    job_id: str | None = None
    slurm_state: str | None = None


def time_limit_minutes(value: str) -> int:
    """`[D-]HH:MM[:SS]` -> whole minutes, rounded up (submitit takes `time` in minutes)."""
    match = _TIME_LIMIT.match(value)
    if not match:
        raise ValueError(f"bad Slurm time limit {value!r}")
    days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
    return max(1, math.ceil(((days * 24 + hours) * 60 + minutes) + seconds / 60))


def expand_nodelist(nodelist: str) -> list[str]:
    """Slurm's compressed host list (`node[1-3,5],gpu07`) -> `['node1', 'node2', 'node3', 'node5', 'gpu07']`.

    `None assigned` and the empty string give `[]`.
    """
    if not nodelist or nodelist.startswith("None"):
        return []
    hosts: list[str] = []
    for group in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*", nodelist):
        prefixes = [""]
        for literal, ranges in re.findall(r"([^\[]*)(?:\[([^\]]*)\])?", group):
            prefixes = [p + literal for p in prefixes]
            if ranges:
                suffixes: list[str] = []
                for part in ranges.split(","):
                    low, _, high = part.partition("-")
                    if high:
                        suffixes += [f"{n:0{len(low)}d}" for n in range(int(low), int(high) + 1)]
                    else:
                        suffixes.append(part)
                prefixes = [p + s for p in prefixes for s in suffixes]
        hosts += prefixes
    return hosts


def rdzv_port(name: str, base: int = 20000, span: int = 20000) -> int:
    """A per-attempt rendezvous port: jobs that share a first node do not share a TCPStore."""
    return base + zlib.crc32(name.encode()) % span


class NodeLauncher(submitit.helpers.Checkpointable):
    """Runs inside the Slurm job, once per node (one submitit task per node): torchrun for that node.

    Contract: exit code 0 when every rank succeeded; otherwise the first failed rank's exit code as
    torchrun reports it (torchrun's own code when it reports none). Output goes to submitit's per-task
    log files. `checkpoint` (submitit, on a preemption `USR2`) returns this launcher again, so a requeued
    job starts the same command; near the time limit `USR2` is ignored so Slurm reports `TIMEOUT`.
    """

    def __init__(self, req_json: str, port: int, plan_file: str, timeout_min: int, bindir: str) -> None:
        self.req_json = req_json
        self.port = port
        self.plan_file = plan_file
        self.timeout_min = timeout_min
        self.bindir = bindir  # put first on PATH: the `python` in torchrun's command line is this one

    def environment(self, req: LaunchRequest, base: dict[str, str]) -> dict[str, str]:
        out_dir = str(Path(self.plan_file).parent / "out")
        env = {**base, OUT_ENV: out_dir, **req.env, "SHARDCTL_PLAN_FILE": self.plan_file,
               "SHARDCTL_JOB_ID": str(req.job_id), "SHARDCTL_ATTEMPT": str(req.attempt),
               "SHARDCTL_ATTEMPT_NAME": req.name}
        env["PATH"] = self.bindir + os.pathsep + env.get("PATH", os.defpath)
        return env

    def command(self, first_host: str) -> list[str]:
        req = LaunchRequest.model_validate_json(self.req_json)
        return torchrun_command(req, rdzv_endpoint=f"{first_host}:{self.port}")

    def __call__(self) -> int:
        job_env = submitit.JobEnvironment()
        req = LaunchRequest.model_validate_json(self.req_json)
        first_host = job_env.hostnames[0]
        self._guard_time_limit_signal()
        env = self.environment(req, dict(os.environ))
        cmd = self.command(first_host)
        print(f"shardctl: node {job_env.node}/{job_env.num_nodes} on {job_env.hostname}: {' '.join(cmd)}",
              flush=True)
        usr2 = submitit.JobEnvironment._usr_sig()
        # Slurm signals every process of the step: torchrun and the ranks ignore submitit's USR2 (an
        # inherited SIG_IGN survives exec), so only this launcher decides between requeue and TIMEOUT.
        proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True, bufsize=1,
                                preexec_fn=lambda: signal.signal(usr2, signal.SIG_IGN))
        assert proc.stderr is not None
        failed_code: int | None = None
        for line in proc.stderr:
            sys.stderr.write(line)
            sys.stderr.flush()
            match = _EXITCODE_IN_TORCHRUN_REPORT.search(line)
            if match and failed_code is None and int(match.group(1)) != 0:
                failed_code = int(match.group(1))
        rc = proc.wait()
        if rc != 0:
            code = failed_code if failed_code is not None and failed_code > 0 else rc
            print(f"shardctl: torchrun exited {rc}; program exit code {code}", file=sys.stderr, flush=True)
            sys.exit(code if 0 < code < 256 else 1)
        return 0

    def _guard_time_limit_signal(self) -> None:
        """Keep submitit's USR2 handler for preemption; near the time limit, let Slurm end the job (TIMEOUT)."""
        usr2 = submitit.JobEnvironment._usr_sig()
        inner = signal.getsignal(usr2)
        started = time.monotonic()
        limit_s = self.timeout_min * 60

        def handler(signum: int, frame: FrameType | None) -> None:
            elapsed = time.monotonic() - started
            if elapsed >= min(limit_s * 0.8, limit_s - 600) or elapsed >= limit_s - 300:
                print(f"shardctl: {signal.Signals(signum).name} near the time limit ({elapsed:.0f}s of "
                      f"{limit_s}s): not requeuing, Slurm ends the job as TIMEOUT", file=sys.stderr, flush=True)
                return
            print(f"shardctl: {signal.Signals(signum).name}: preempted, requeuing through submitit",
                  file=sys.stderr, flush=True)
            if callable(inner):
                inner(signum, frame)

        signal.signal(usr2, handler)

    def checkpoint(self, *args: Any, **kwargs: Any) -> DelayedSubmission:
        return DelayedSubmission(NodeLauncher(self.req_json, self.port, self.plan_file, self.timeout_min, self.bindir))


class SlurmBackend:
    """`Backend` for Slurm through submitit. Thread-compatible (no shared mutable state but `calls`).

    `folder` holds one directory per attempt name (`<folder>/<name>/`): the plan file, submitit's
    pickles, the sbatch script and the per-node logs. On a real cluster it must be on a file system
    shared with the compute nodes.
    """

    name = "slurm"
    capabilities = Capabilities(multi_node=True, gpus=True, logs=True, preemption_requeue=True)
    #: sacct window for lookups by name (sacct without -j only searches since midnight by default)
    FIND_WINDOW: ClassVar[str] = "now-30days"

    def __init__(self, folder: Path, *, partition: str | None = None, default_time_limit: str = "01:00:00",
                 cpus_per_proc: int = 1, signal_delay_s: int = 60, python: str | None = None,
                 command_timeout_s: float = 60.0,
                 runner: Callable[..., subprocess.CompletedProcess[str]] | None = None) -> None:
        """`partition`: used when the spec names none (else Slurm's default partition).
        `default_time_limit`: used when the spec sets none (submitit would otherwise impose 5 minutes).
        `runner`: replaces `subprocess.run` for every CLI call this class makes (tests and benchmarks count).
        """
        self.folder = Path(folder).resolve()
        self.partition = partition
        self.default_time_limit = default_time_limit
        self.cpus_per_proc = cpus_per_proc
        self.signal_delay_s = signal_delay_s
        self.python = python
        self.command_timeout_s = command_timeout_s
        self._runner = runner or subprocess.run
        self.calls: Counter[str] = Counter()

    # -- building the request -------------------------------------------------------------------

    def options(self, req: LaunchRequest) -> SlurmOptions:
        return SlurmOptions.model_validate(req.backend_options)

    def job_folder(self, name: str) -> Path:
        return self.folder / name

    def parameters(self, req: LaunchRequest) -> dict[str, Any]:
        """The submitit `SlurmExecutor` parameters (Slurm's own names) for this attempt."""
        opts = self.options(req)
        timeout_min = time_limit_minutes(opts.time_limit or self.default_time_limit)
        params: dict[str, Any] = {
            "job_name": req.name,
            "nodes": req.nodes,
            "ntasks_per_node": 1,
            "cpus_per_task": max(1, req.procs_per_node * self.cpus_per_proc),
            "time": timeout_min,
            "signal_delay_s": self.signal_delay_s,
        }
        if req.gpus_per_proc > 0:
            params["gpus_per_node"] = req.procs_per_node * req.gpus_per_proc
        partition = opts.partition or self.partition
        for name, chosen in (("partition", partition), ("account", opts.account), ("qos", opts.qos)):
            if chosen:
                params[name] = chosen
        extra: dict[str, Any] = {}
        known = _submitit_parameter_names()
        for flag in opts.sbatch:
            match = _SBATCH_FLAG.match(flag)
            assert match is not None  # validated by SlurmOptions
            value: Any = True if match.group(2) is None else match.group(2)
            key = match.group(1).replace("-", "_")
            if key in known:  # e.g. --cpus-per-task=8, --mem=64G, --exclusive: replace submitit's own value
                params[key] = int(value) if isinstance(value, str) and value.isdigit() else value
            else:
                extra[match.group(1)] = value
        # The job runs in its attempt folder: sacct's WorkDir then tells this backend's jobs from other
        # submissions of the same name (another data dir, an earlier install with a fresh database).
        params["additional_parameters"] = {**extra, "chdir": str(self.job_folder(req.name))}
        return params

    def _launcher(self, req: LaunchRequest, params: dict[str, Any]) -> NodeLauncher:
        plan_file = str(self.job_folder(req.name) / "plan.json")
        return NodeLauncher(req.model_dump_json(), rdzv_port(req.name), plan_file, int(params["time"]),
                            str(Path(self._python()).parent))

    def _python(self) -> str:
        return self.python or sys.executable

    def render(self, req: LaunchRequest) -> Rendered:
        """The sbatch script submitit writes and the parameters it gets, as data. Submits nothing.

        `%j`/`%t` in paths are Slurm's job id and task id, filled at run time.
        """
        params = self.parameters(req)
        folder = self.job_folder(req.name)
        launcher = self._launcher(req, params)
        submit_cmd = f"{shlex.quote(self._python())} -u -m submitit.core._submit {shlex.quote(str(folder))}"
        script = _make_sbatch_string(command=submit_cmd, folder=folder, **params)
        first = "$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n1)"
        return Rendered(backend=self.name, name=req.name, content={
            "sbatch_script": script,
            "submitit_parameters": params,
            "folder": str(folder),
            "plan_file": launcher.plan_file,
            "per_node_command": launcher.command(first),
            "rdzv_port": launcher.port,
            "env": {k: (REDACTED if is_secret_env(k) else v)
                    for k, v in launcher.environment(req, {"PATH": "$PATH"}).items() if k != PLAN_ENV},
        })

    # -- talking to Slurm --------------------------------------------------------------------------

    def _run(self, args: list[str], *, ok_codes: Sequence[int] = (0,)) -> subprocess.CompletedProcess[str]:
        """Run a Slurm CLI command. Unreachable controller/DB, a timeout or a missing binary -> BackendUnavailable."""
        self.calls[args[0]] += 1
        try:
            proc = self._runner(args, capture_output=True, text=True, timeout=self.command_timeout_s, check=False)
        except (subprocess.TimeoutExpired, FileNotFoundError) as exc:
            raise BackendUnavailable(f"{args[0]}: {exc}") from exc
        if proc.returncode not in ok_codes and _UNREACHABLE.search(proc.stderr or ""):
            raise BackendUnavailable(f"{args[0]}: {proc.stderr.strip()}")
        return proc

    def submit(self, req: LaunchRequest) -> Handle:
        """sbatch through submitit. Raises BackendUnavailable (nothing known to be submitted) or
        SlurmSubmitError (Slurm refused it). The caller should `find(req.name)` first (adopt-before-submit)."""
        params = self.parameters(req)
        folder = self.job_folder(req.name)
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        (folder / "plan.json").write_text(json.dumps(req.plan))
        (folder / "request.json").write_text(json.dumps({"name": req.name, "nodes": req.nodes,
                                                         "procs_per_node": req.procs_per_node}))
        executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=0, python=shlex.quote(self._python()))
        executor.update_parameters(**params)
        self.calls["sbatch"] += 1
        try:
            job = executor.submit(self._launcher(req, params))
        except submitit.core.utils.FailedJobError as exc:
            if _UNREACHABLE.search(str(exc)):
                raise BackendUnavailable(f"sbatch: {exc}") from exc
            raise SlurmSubmitError(f"sbatch refused {req.name}: {exc}") from exc
        except (subprocess.TimeoutExpired, OSError) as exc:
            raise BackendUnavailable(f"sbatch: {exc}") from exc
        return Handle(name=req.name, backend_id=str(job.job_id))

    def find(self, name: str) -> Handle | None:
        """The newest Slurm job named `name` that this backend submitted (its WorkDir is this backend's
        attempt folder): `squeue` (live, no accounting lag), then `sacct` (finished, purged from squeue)."""
        mine = str(self.job_folder(name))
        proc = self._run(["squeue", "-h", "-t", "all", "-n", name, "-o", "%i|%Z"])
        if proc.returncode != 0:
            raise BackendUnavailable(f"squeue: {proc.stderr.strip()}")
        ids = _ids_in(proc.stdout, mine)
        if not ids:
            proc = self._run(["sacct", "-n", "-P", "-X", "-S", self.FIND_WINDOW, "-E", "now", "--name", name,
                              "-o", "JobIDRaw,WorkDir"])
            if proc.returncode != 0:
                raise BackendUnavailable(f"sacct: {proc.stderr.strip()}")
            ids = _ids_in(proc.stdout, mine)
        if not ids:
            return None
        return Handle(name=name, backend_id=str(max(ids)))

    def poll(self, handles: Sequence[Handle]) -> dict[str, Observation]:
        """State of every handle, keyed by handle name: ONE sacct call (+ at most one squeue for jobs
        sacct does not list yet). A name Slurm does not know at all is `MISSING`."""
        if not handles:
            return {}
        by_id = {h.backend_id: h for h in handles if h.backend_id}
        unnamed = [h for h in handles if not h.backend_id]
        args = ["sacct", "-n", "-P", "-X", "--duplicates", "-o", ",".join(_SACCT_FIELDS)]
        if unnamed:  # some ids unknown: one lookup by name for all handles (time window needed without -j)
            args += ["-S", self.FIND_WINDOW, "-E", "now", "--name", ",".join(h.name for h in handles)]
        else:
            args += ["-j", ",".join(by_id)]
        proc = self._run(args)
        if proc.returncode != 0:
            raise BackendUnavailable(f"sacct: {proc.stderr.strip()}")
        records: dict[str, list[dict[str, str]]] = {}
        for line in proc.stdout.splitlines():
            fields = line.split("|")
            if len(fields) != len(_SACCT_FIELDS):
                continue
            rec = dict(zip(_SACCT_FIELDS, fields, strict=True))
            records.setdefault(rec["JobIDRaw"], []).append(rec)
        out: dict[str, Observation] = {}
        want: dict[str, str] = {}  # name -> job id to read
        for h in handles:
            if h.backend_id:
                want[h.name] = h.backend_id
            else:
                mine = str(self.job_folder(h.name))
                ids = [int(j) for j, recs in records.items()
                       if recs[-1]["JobName"] == h.name and recs[-1]["WorkDir"] == mine]
                if ids:
                    want[h.name] = str(max(ids))
        # squeue is the controller's current view; sacct lags it by up to seconds (slurmdbd). One squeue
        # for the handles sacct does not know yet or still shows PENDING/RUNNING.
        fresh = [h for h in handles
                 if want.get(h.name) not in records or records[want[h.name]][-1]["State"].split(" ")[0] in _LIVE
                 or not _nodes_complete(records[want[h.name]][-1])]
        live: dict[str, dict[str, str]] = self._squeue([h.name for h in fresh]) if fresh else {}
        for h in handles:
            job_id = want.get(h.name)
            now = live.get(h.name)
            if now is not None and ((job_id is None and now["WorkDir"] != str(self.job_folder(h.name)))
                                    or (job_id is not None and now["JobIDRaw"] != job_id)):
                now = None
            if job_id is not None and job_id in records:
                recs = records[job_id]
                if now is not None and now["State"] in _LIVE:  # fresher than sacct; sacct keeps the history
                    recs = [*recs[:-1], {**recs[-1], "State": now["State"],
                                         "NodeList": _fuller(recs[-1]["NodeList"], now["NodeList"])}]
                elif now is not None and not _nodes_complete(recs[-1]):
                    recs = [*recs[:-1], {**recs[-1], "NodeList": _fuller(recs[-1]["NodeList"], now["NodeList"])}]
                elif now is not None and recs[-1]["State"] == "PENDING" and now["State"] != "CANCELLED":
                    # it ran and ended; sacct has not caught up: RUNNING until sacct has its exit code
                    recs = [*recs[:-1], {**recs[-1], "State": "RUNNING", "NodeList": now["NodeList"]}]
                out[h.name] = self._observe(h.name, recs)
            elif now is not None and now["State"] not in _LIVE and now["State"] != "CANCELLED":
                # ended before sacct ever saw it: its exit code and node list are sacct's to give
                out[h.name] = self._observe(h.name, [{**now, "State": "RUNNING"}])
            elif now is not None:
                out[h.name] = self._observe(h.name, [now])
            else:
                out[h.name] = SlurmObservation(state=RunState.MISSING, job_id=job_id,
                                               reason="Slurm has no job by this id/name")
        return out

    def _squeue(self, names: list[str]) -> dict[str, dict[str, str]]:
        """One squeue for these names: name -> newest record (id, state, nodes, reason, workdir)."""
        proc = self._run(["squeue", "-h", "-t", "all", "-n", ",".join(names), "-o", _SQUEUE_FORMAT])
        if proc.returncode != 0:
            raise BackendUnavailable(f"squeue: {proc.stderr.strip()}")
        live: dict[str, dict[str, str]] = {}
        for line in proc.stdout.splitlines():
            job_id, name, state, nodelist, reason, workdir, count = (line.split("|") + [""] * 7)[:7]
            if job_id.isdigit() and (name not in live or int(job_id) > int(live[name]["JobIDRaw"])):
                live[name] = {"JobIDRaw": job_id, "JobName": name, "State": state, "ExitCode": "0:0",
                              "NodeList": nodelist, "Reason": reason, "WorkDir": workdir, "NNodes": count}
        return live

    def _observe(self, name: str, recs: list[dict[str, str]]) -> SlurmObservation:
        """Map sacct records of one job id (oldest first; earlier ones are requeued runs) to an Observation."""
        cur = recs[-1]
        slurm_state = cur["State"].split()[0] if cur["State"] else "UNKNOWN"
        earlier = recs[:-1]
        requeue_reasons = [f"{r['State'].split()[0].lower()} (run on {r['NodeList']})" for r in earlier]
        code, sig = _exit_code(cur["ExitCode"])
        nodes = expand_nodelist(cur["NodeList"])
        reason = cur.get("Reason") or None
        if reason == "None":
            reason = None
        state: RunState
        failure: FailureClass | None = None
        exit_code: int | None = None
        if slurm_state in _WAITING:
            state = RunState.PENDING
            nodes = []
        elif slurm_state in _RUNNING:
            state = RunState.RUNNING
        elif slurm_state == "COMPLETED":
            state, exit_code = RunState.SUCCEEDED, 0
        elif slurm_state in ("CANCELLED", "REVOKED"):
            state, failure = RunState.CANCELLED, "cancelled"
            reason = cur["State"].lower()
        else:
            state = RunState.FAILED
            exit_code = code if code else (128 + sig if sig else code)
            mapped = _FAILED_STATES.get(slurm_state, ("lost", f"Slurm state {slurm_state}"))
            failure, why = mapped
            reason = f"{why} (Slurm {slurm_state}, exit {cur['ExitCode']})"
        if state in (RunState.SUCCEEDED, RunState.FAILED) and not _nodes_complete(cur):
            # accounting has not recorded all its nodes yet: no verdict until it has
            state, exit_code, failure, reason = RunState.RUNNING, None, None, "ended; Slurm is still recording it"
        obs = SlurmObservation(state=state, nodes=nodes, exit_code=exit_code, failure=failure, reason=reason,
                               job_id=cur["JobIDRaw"], slurm_state=slurm_state, requeues=len(earlier),
                               requeue_reasons=requeue_reasons)
        if earlier and state in (RunState.PENDING, RunState.RUNNING):
            obs.reason = f"requeued {len(earlier)}x: {'; '.join(requeue_reasons)}"
        if state == RunState.FAILED:
            obs.log_tail = self.log_tail(name, cur["JobIDRaw"])
        return obs

    def cancel(self, handle: Handle) -> None:
        """scancel by id (by name when the id is unknown). Idempotent: a finished or unknown job is fine."""
        target = [handle.backend_id] if handle.backend_id else ["-n", handle.name]
        proc = self._run(["scancel", *target], ok_codes=(0, 1))
        if proc.returncode != 0 and not re.search(r"already completing or completed|Invalid job id",
                                                  proc.stderr, re.IGNORECASE):
            raise BackendUnavailable(f"scancel: {proc.stderr.strip()}")

    # -- logs -------------------------------------------------------------------------------------

    def _log_files(self, name: str, job_id: str | None, task: int | None = None) -> list[Path]:
        folder = self.job_folder(name)
        if not folder.is_dir():
            return []
        pattern = f"{job_id or '*'}_{'*' if task is None else task}_log."
        files = sorted(folder.glob(pattern + "err")) + sorted(folder.glob(pattern + "out"))
        return sorted(files, key=lambda p: (p.name.split("_")[1], p.suffix != ".err"))

    def log_tail(self, name: str, job_id: str | None, lines: int = LOG_TAIL_LINES) -> str | None:
        """The last `lines` lines of each node's stdout and of its stderr, headed by node and stream.

        submitit's own INFO/WARNING lines, C++ stack frames and torchrun's own Python tracebacks are left
        out; the node whose torchrun reported the root cause comes first. At most 8000 characters."""
        noise = re.compile(r"submitit (INFO|WARNING)|^frame #\d+|^<omitting python frames>|^Exception raised from"
                           r"|^[EW]\d{4} |^\[W\d{4}|^Exception ignored in")
        parts: list[tuple[bool, str, str, list[str]]] = []
        for path in self._log_files(name, job_id):
            task = path.name.split("_")[1]
            text = _drop_launcher_tracebacks(
                [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip() and not noise.search(ln)])
            if text:
                root = any("Root Cause" in ln for ln in text)
                parts.append((not root, task, "stdout" if path.suffix == ".out" else "stderr", text[-lines:]))
        if not parts:
            return None
        root_tasks = {task for not_root, task, _, _ in parts if not not_root}
        parts.sort(key=lambda p: (p[1] not in root_tasks, p[1], p[2] == "stderr"))
        return "\n".join(f"[node {task} {stream}]\n" + "\n".join(text) for _, task, stream, text in parts)[-8000:]

    def logs(self, handle: Handle, rank: int = 0, follow: bool = False) -> Iterator[str]:
        """Lines of the node that runs global `rank` (node = rank // procs_per_node; torchrun writes all
        local ranks of a node to that node's files): stdout then stderr. `follow` keeps reading the
        stdout file until the job is no longer PENDING/RUNNING."""
        req_file = self.job_folder(handle.name) / "request.json"
        procs = 1
        if req_file.exists():
            procs = max(1, int(json.loads(req_file.read_text()).get("procs_per_node", 1)))
        task = rank // procs
        job_id = handle.backend_id or (found.backend_id if (found := self.find(handle.name)) else None)
        outs = self._log_files(handle.name, job_id, task)
        if not follow:
            for path in sorted(outs, key=lambda p: p.suffix != ".out"):
                yield from path.read_text(errors="replace").splitlines()
            return
        out_path = self.job_folder(handle.name) / f"{job_id}_{task}_log.out"
        pos = 0
        while True:
            if out_path.exists():
                with out_path.open(errors="replace") as fh:
                    fh.seek(pos)
                    chunk = fh.read()
                    pos = fh.tell()
                yield from chunk.splitlines()
            obs = self.poll([Handle(name=handle.name, backend_id=job_id)])[handle.name]
            if obs.state not in (RunState.PENDING, RunState.RUNNING):
                if out_path.exists():
                    with out_path.open(errors="replace") as fh:
                        fh.seek(pos)
                        yield from fh.read().splitlines()
                return
            time.sleep(1.0)


def _ids_in(output: str, workdir: str) -> list[int]:
    """Job ids from `id|workdir` lines whose working directory is `workdir`."""
    ids = []
    for line in output.splitlines():
        job_id, _, wd = line.partition("|")
        if job_id.strip().isdigit() and wd.strip() == workdir:
            ids.append(int(job_id))
    return ids


def _drop_launcher_tracebacks(lines: list[str]) -> list[str]:
    """Remove torchrun's own Python tracebacks (those ending in a torch.distributed error), keeping the
    exception line and the program's tracebacks: a log tail should show the program, not the launcher."""
    out: list[str] = []
    buffered: list[str] | None = None
    for line in lines:
        if line.startswith("Traceback (most recent call last)"):
            if buffered:
                out += buffered
            buffered = [line]
        elif buffered is not None:
            if line.startswith(("srun:", "slurmstepd", "shardctl:")):  # interleaved from other writers
                out.append(line)
                continue
            if line.startswith((" ", "\t")):
                buffered.append(line)
                continue
            if "torch.distributed" not in line and "ChildFailedError" not in line:
                out += buffered
            buffered = None
            out.append(line)
        else:
            out.append(line)
    return out + (buffered or [])


def _exit_code(value: str) -> tuple[int, int]:
    """sacct `ExitCode` "code:signal" -> (code, signal)."""
    code, _, sig = value.partition(":")
    try:
        return int(code or 0), int(sig or 0)
    except ValueError:
        return 0, 0
