"""The Slurm CLI: the one place this backend talks to Slurm (`sbatch` through submitit, `squeue`,
`sacct`, `scancel`).

Contract, for every call:

- it is counted in `calls` (per command), whether it succeeds or not;
- Slurm not answering (controller or slurmdbd unreachable, a timeout, no binary) raises
  `BackendUnavailable`; a query (`squeue`, `sacct`) failing for any reason does too: its output is
  no verdict on any job;
- sbatch refusing a submission raises `SubmissionRefused`, or `TransientBackendError` when Slurm
  says to try later (it cannot take jobs right now).

Output comes back raw; `accounting` parses it.
"""

from __future__ import annotations

import re
import subprocess
from collections import Counter
from collections.abc import Callable, Sequence

import submitit
from submitit.core.utils import FailedJobError, FailedSubmissionError

from workers.backends.base import BackendUnavailable, SubmissionRefused, TransientBackendError
from workers.backends.slurm.launcher import NodeLauncher
from workers.backends.slurm.submission import SlurmSubmission, launcher_python

#: `subprocess.run`'s signature: what runs every query (tests and benchmarks pass their own to count or fake)
Runner = Callable[..., subprocess.CompletedProcess[str]]

#: stderr fragments that mean "Slurm did not answer", not "this request is wrong"
UNREACHABLE = re.compile(
    r"Unable to contact slurm controller|Socket timed out|Connection refused|Connection timed out"
    r"|Unable to establish|slurmdbd.*(not|un)|Problem talking to the database|Zero Bytes were transmitted"
    r"|Could not establish a configuration source|Transport endpoint",
    re.IGNORECASE,
)
#: sbatch refusals that pass by themselves: Slurm answered that it cannot take a job right now
BUSY = re.compile(r"temporarily unable to accept|Resource temporarily unavailable", re.IGNORECASE)
#: scancel's answers for a job that is already over or unknown: cancelling it is done
_NOTHING_TO_CANCEL = re.compile(r"already completing or completed|Invalid job id", re.IGNORECASE)


class SlurmClient:
    """Runs the Slurm CLI. Thread-compatible: the only shared state is the `calls` counter."""

    def __init__(self, runner: Runner | None = None, timeout_s: float = 60.0) -> None:
        """`runner` replaces `subprocess.run` for squeue, sacct and scancel (sbatch goes through
        submitit, which runs it itself); `timeout_s` bounds each of those calls."""
        self._runner = runner or subprocess.run
        self.timeout_s = timeout_s
        self.calls: Counter[str] = Counter()

    def run(self, args: list[str], *, ok_codes: Sequence[int] = (0,)) -> subprocess.CompletedProcess[str]:
        """Run one command. Unreachable controller/DB, a timeout or a missing binary -> BackendUnavailable;
        any other exit code is the caller's to judge."""
        self.calls[args[0]] += 1
        try:
            proc = self._runner(args, capture_output=True, text=True, timeout=self.timeout_s, check=False)
        except (subprocess.TimeoutExpired, FileNotFoundError) as exc:
            raise BackendUnavailable(f"{args[0]}: {exc}") from exc
        if proc.returncode not in ok_codes and UNREACHABLE.search(proc.stderr or ""):
            raise BackendUnavailable(f"{args[0]}: {proc.stderr.strip()}")
        return proc

    def query(self, args: list[str]) -> str:
        """stdout of a read-only command (squeue, sacct); BackendUnavailable if it fails in any way."""
        proc = self.run(args)
        if proc.returncode != 0:
            raise BackendUnavailable(f"{args[0]}: {proc.stderr.strip()}")
        return proc.stdout

    def scancel(self, target: list[str]) -> None:
        """`scancel <target>`; a job that is already over or unknown is fine (idempotent)."""
        proc = self.run(["scancel", *target], ok_codes=(0, 1))
        if proc.returncode != 0 and not _NOTHING_TO_CANCEL.search(proc.stderr):
            raise BackendUnavailable(f"scancel: {proc.stderr.strip()}")

    def sbatch(self, submission: SlurmSubmission) -> str:
        """Submit `submission` through submitit's public executor API: its `parameters`, a pickled
        `NodeLauncher` of its `launch` (secrets included). Returns the Slurm job id. The folder must exist."""
        self.calls["sbatch"] += 1
        try:
            executor = submitit.SlurmExecutor(folder=submission.folder, max_num_timeout=0,
                                              python=launcher_python(submission.python))
        except RuntimeError as exc:  # submitit found no `srun`: this machine is no Slurm client
            raise BackendUnavailable(f"sbatch: {exc}") from exc
        executor.update_parameters(**submission.parameters)
        try:
            job = executor.submit(NodeLauncher(submission.launch))
        except FailedJobError as exc:  # sbatch exited non-zero: its stderr is the message
            if UNREACHABLE.search(str(exc)):
                raise BackendUnavailable(f"sbatch: {exc}") from exc
            if BUSY.search(str(exc)):
                raise TransientBackendError(f"sbatch: {exc}") from exc
            raise SubmissionRefused(f"sbatch refused it: {exc}") from exc
        except FailedSubmissionError as exc:  # sbatch answered something without a job id
            raise TransientBackendError(f"sbatch: {exc}") from exc
        except OSError as exc:  # no sbatch binary, an unwritable folder
            raise BackendUnavailable(f"sbatch: {exc}") from exc
        return str(job.job_id)
