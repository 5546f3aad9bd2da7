"""What runs inside the Slurm job: one `NodeLauncher` per node (one submitit task per node) starts
torchrun for that node.

`NodeLaunch` is everything the launcher needs, fixed at submission by `submission.build_submission`.
It has two forms: serialised (`model_dump`, the dry run) its secrets read `<redacted>` and the plan is
left out for length; pickled by submitit into the job folder (the submission) everything travels
whole. The job folder is private to the service's user (mode 0700), as the job token is in the pickle.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from types import FrameType

import submitit
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_serializer

from service.jobenv import PLAN
from service.redaction import REDACTED
from workers.backends.base import local_path_env

#: The job's first host as the shell would compute it. It stands in the rendered `--rdzv-endpoint`;
#: the launcher replaces it with `submitit.JobEnvironment().hostnames[0]`, the same host.
FIRST_HOST = '$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)'
_RDZV_ENDPOINT = "--rdzv-endpoint="
_EXITCODE_IN_TORCHRUN_REPORT = re.compile(r"exitcode\s*:\s*(-?\d+)")


class NodeLaunch(BaseModel):
    """The inputs of `NodeLauncher`, identical on every node of one attempt."""

    model_config = ConfigDict(frozen=True)

    command: list[str] = Field(description=f"torchrun for one node; {FIRST_HOST} in its --rdzv-endpoint is "
                                           "replaced by the job's first host on the node.")
    rdzv_port: int = Field(description="Derived from the attempt folder: jobs sharing a first node get different"
                                       " TCPStores.")
    time_limit_min: int = Field(description="The job's --time: near it, USR2 no longer requeues.")
    bindir: str = Field(description="Put first on PATH: the `python` of the command is the service's.")
    env: dict[str, str] = Field(description="The plain variables every rank gets (user env + job contract).")
    secrets: dict[str, SecretStr] = Field(description="The secret ones (the job token, *PASSWORD*...).")

    @field_serializer("env")
    def _without_plan(self, env: dict[str, str]) -> dict[str, str]:
        return {k: v for k, v in env.items() if k != PLAN}

    @field_serializer("secrets")
    def _redacted(self, secrets: dict[str, SecretStr]) -> dict[str, str]:
        return dict.fromkeys(secrets, REDACTED)

    def environment(self, base: Mapping[str, str]) -> dict[str, str]:
        """What every process on the node gets: `base` (the node's own environment), the job's plain
        and secret variables over it, and `bindir` first on PATH."""
        return local_path_env({**base, **self.env, **{k: v.get_secret_value() for k, v in self.secrets.items()}},
                              self.bindir)

    def command_on(self, first_host: str) -> list[str]:
        """The command with the rendezvous endpoint on `first_host`."""
        return [arg.replace(FIRST_HOST, first_host) if arg.startswith(_RDZV_ENDPOINT) else arg
                for arg in self.command]


def preemption_signal() -> signal.Signals:
    """The signal submitit asks Slurm to send before the time limit (`--signal`), USR2 by default."""
    return signal.Signals["SIG" + submitit.JobEnvironment.USR_SIG]


class NodeLauncher(submitit.helpers.Checkpointable):
    """Runs inside the Slurm job, once per node: torchrun for that node, in the job's environment.

    Contract: exit code 0 when every rank succeeded; otherwise the first failed rank's exit code as
    torchrun reports it (torchrun's own code when it reports none), so `sacct` shows it. Output goes
    to submitit's per-task log files. Preemption: submitit's handler of the preemption signal calls
    `checkpoint` (Checkpointable's: this same launcher) and requeues the job, which then starts the same
    command; near the time limit the signal is ignored so Slurm ends the job as TIMEOUT.
    """

    def __init__(self, launch: NodeLaunch) -> None:
        self.launch = launch

    def __call__(self) -> int:
        job_env = submitit.JobEnvironment()
        self._guard_time_limit_signal()
        cmd = self.launch.command_on(job_env.hostnames[0])
        print(f"shardctl: node {job_env.node}/{job_env.num_nodes} on {job_env.hostname}: {' '.join(cmd)}",
              flush=True)
        usr2 = preemption_signal()
        # Slurm signals every process of the step: torchrun and the ranks ignore submitit's signal (an
        # inherited SIG_IGN survives exec), so only this launcher decides between requeue and TIMEOUT.
        proc = subprocess.Popen(cmd, env=self.launch.environment(os.environ), stderr=subprocess.PIPE, text=True,
                                bufsize=1, preexec_fn=lambda: signal.signal(usr2, signal.SIG_IGN))
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
        """Keep submitit's handler for preemption; near the time limit, let Slurm end the job (TIMEOUT)."""
        usr2 = preemption_signal()
        inner = signal.getsignal(usr2)
        started = time.monotonic()
        limit_s = self.launch.time_limit_min * 60

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
