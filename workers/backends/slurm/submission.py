"""One attempt as one sbatch submission: `build_submission(req, ...)` is the only place it is decided.

`SlurmBackend.render` returns the `SlurmSubmission` serialised (secrets redacted, the plan left out);
`SlurmBackend.submit` hands the same object to `client.SlurmClient.sbatch`, which gives submitit its
`parameters` and pickles a `NodeLauncher` of its `launch`. `sbatch_script` is submitit's own rendering
of those parameters: the file submitit writes and sbatch reads (tests/slurm compares the two).

Shape: `--nodes=req.nodes --ntasks-per-node=1` (one task per node, which is one torchrun agent);
`--cpus-per-task=procs_per_node*cpus_per_proc`; `--gpus-per-node=procs_per_node*gpus_per_proc` when
> 0; partition (else the backend's default), account, QOS and `--time` (else the backend's default)
from `SlurmOptions`; extra sbatch flags replace the backend's value or are added (submitit's
`additional_parameters` force any parameter); the job runs in `--chdir=<folder>/<name>`, which is
how `find` tells this backend's jobs from others of the same name. Checkpoints live per job, in
`<folder>/../checkpoints/job-<id>` (`job_checkpoint_dir`, given as `$SHARDCTL_CHECKPOINT_DIR`), so every
attempt of a job, requeued or submitted again after a preemption, resumes from the same place.
"""

from __future__ import annotations

import shlex
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr
from submitit.slurm.slurm import _make_sbatch_string

from service.backend_options import SlurmOptions, sbatch_flag, time_limit_minutes
from service.jobenv import CHECKPOINT_DIR
from service.redaction import is_secret_env
from workers.backends.base import LOG_ENV, LaunchRequest, SubmissionRefused, torchrun_command
from workers.backends.slurm.launcher import FIRST_HOST, NodeLaunch, preemption_signal


@dataclass(frozen=True)
class SubmissionDefaults:
    """The backend's settings that shape every submission (see `SlurmBackend.__init__`)."""

    python: str
    partition: str | None = None
    default_time_limit: str = "01:00:00"
    cpus_per_proc: int = 1
    signal_delay_s: int = 60


class SlurmSubmission(BaseModel):
    """Everything sbatch gets for one attempt. Serialised it is the dry run; `client.SlurmClient.sbatch`
    submits it."""

    model_config = ConfigDict(frozen=True)

    folder: str = Field(description="The attempt's folder: submitit's pickle, script and logs; the job's cwd.")
    python: str = Field(description="The interpreter that runs submitit (and torchrun) on the nodes.")
    parameters: dict[str, Any] = Field(description="submitit SlurmExecutor parameters (Slurm's names).")
    sbatch_script: str = Field(description="The sbatch file submitit writes from `parameters`.")
    launch: NodeLaunch = Field(description="What the pickled NodeLauncher runs on every node.")


def slurm_options(req: LaunchRequest) -> SlurmOptions:
    """The request's options, which the API validated at submit; any other backend's are refused."""
    if not isinstance(req.options, SlurmOptions):
        raise SubmissionRefused(f"{req.name}: the Slurm backend got {req.options.kind} options")
    return req.options


#: Linux's default ephemeral range (`net.ipv4.ip_local_port_range`) starts at 32768: any outgoing
#: connection on the node (a database client, gloo's own pairs) may hold a port there, and torchrun's
#: store then fails to bind with "address already in use". The rendezvous ports stay below it.
RDZV_PORTS = range(20000, 32768)


def rdzv_port(folder: Path) -> int:
    """A per-attempt rendezvous port in `RDZV_PORTS`, from the attempt's folder: jobs that share a first
    node do not share a TCPStore, even two installations' `shardctl-1-1` (the name alone recurs across
    databases)."""
    return RDZV_PORTS[zlib.crc32(str(folder).encode()) % len(RDZV_PORTS)]


def parameters(req: LaunchRequest, opts: SlurmOptions, folder: Path, defaults: SubmissionDefaults) -> dict[str, Any]:
    """The submitit `SlurmExecutor` parameters (Slurm's names with underscores) for this attempt."""
    minutes = time_limit_minutes(opts.time_limit or defaults.default_time_limit)
    params: dict[str, Any] = {
        "job_name": req.name,
        "nodes": req.nodes,
        "ntasks_per_node": 1,
        "cpus_per_task": max(1, req.procs_per_node * defaults.cpus_per_proc),
        "time": minutes,
        # At most half the limit. Slurm may still send it up to 60 s earlier than asked (sbatch(1)), so
        # for a short limit as early as the job starts: `launcher_python` makes that harmless.
        "signal_delay_s": min(defaults.signal_delay_s, minutes * 30),
    }
    if req.gpus_per_proc > 0:
        params["gpus_per_node"] = req.procs_per_node * req.gpus_per_proc
    for key, chosen in (("partition", opts.partition or defaults.partition), ("account", opts.account),
                        ("qos", opts.qos)):
        if chosen:
            params[key] = chosen
    extra: dict[str, Any] = {}
    for flag in opts.sbatch:  # validated by SlurmOptions: long form, none of RESERVED_SBATCH_FLAGS
        name, value = sbatch_flag(flag)
        key = name.replace("-", "_")  # submitit's spelling: the same key replaces its value, never repeats it
        chosen_value: Any = True if value is None else value
        if key in params:  # e.g. --cpus-per-task=8
            params[key] = int(chosen_value) if isinstance(chosen_value, str) and chosen_value.isdigit() \
                else chosen_value
        else:  # e.g. --mem=64G, --exclusive, --constraint=a100: forced over submitit's default, if it has one
            extra[key] = chosen_value
    # The job runs in its attempt folder: sacct's WorkDir then tells this backend's jobs from other
    # submissions of the same name (another data dir, an earlier install with a fresh database).
    params["additional_parameters"] = {**extra, "chdir": str(folder)}
    return params


def launcher_python(python: str) -> str:
    """How the sbatch script starts the interpreter on each node (submitit's `python`, a shell word list):
    through `/bin/sh`, which ignores the preemption signal (`USR2`) and execs `python`, so the launcher
    starts with that signal ignored and keeps it ignored until submitit, then the launcher, install
    their handlers.

    Slurm sends `--signal` up to 60 s earlier than asked (sbatch(1)): with a limit of a minute or two,
    as early as the job starts, while the interpreter is still importing (seconds on a loaded node, or
    on a fresh install compiling its modules). Left at its default action the signal killed the launcher:
    the job ended FAILED with exit code 12 (`program_error`) long before its limit instead of TIMEOUT,
    depending on how fast the node started Python. An ignored signal stays ignored across exec."""
    signame = preemption_signal().name.removeprefix("SIG")
    return f"/bin/sh -c 'trap \"\" {signame}; exec \"$0\" \"$@\"' {shlex.quote(python)}"


def submit_command(python: str, folder: Path) -> str:
    """The command the sbatch script runs on every node (submitit's `SlurmExecutor` builds the same one
    from `launcher_python(python)` and `folder`): submitit loads the pickled launcher and calls it."""
    return f"{launcher_python(python)} -u -m submitit.core._submit {shlex.quote(str(folder))}"


def sbatch_script(python: str, folder: Path, params: dict[str, Any]) -> str:
    """submitit's sbatch file for these parameters, as `SlurmExecutor.submit` writes it.

    The one private submitit call of this backend, kept here alone: submitit has no public way to
    render its sbatch file without submitting it, and writing our own would let the file drift from
    what submitit's on-node half (`submitit.core._submit`, its log paths and signal) expects. The
    cluster tests compare this text with the file submitit wrote for a real submission.
    """
    return _make_sbatch_string(command=submit_command(python, folder), folder=folder, **params)


def job_checkpoint_dir(folder: Path, job_id: int) -> Path:
    """Where every attempt of job `job_id` keeps its checkpoints (`$SHARDCTL_CHECKPOINT_DIR`): one folder
    per job beside the attempt folders of the backend's `folder`, so the attempt after a preemption (a
    fresh sbatch in its own folder) resumes where the preempted one stopped, as after a Slurm requeue."""
    return folder / "checkpoints" / f"job-{job_id}"


def build_submission(req: LaunchRequest, folder: Path, defaults: SubmissionDefaults) -> SlurmSubmission:
    """The whole submission of `req` into its attempt folder `folder`. Raises `SubmissionRefused` for
    options that are not Slurm's; `ValueError` never (the options were validated at submit)."""
    opts = slurm_options(req)
    params = parameters(req, opts, folder, defaults)
    port = rdzv_port(folder)
    environ = {**LOG_ENV, **req.environment(out_dir=str(folder / "out")),
               CHECKPOINT_DIR: str(job_checkpoint_dir(folder.parent, req.job.job_id))}
    secret = {k for k in environ if is_secret_env(k)}  # the job token included: its name says so
    launch = NodeLaunch(command=torchrun_command(req, rdzv_endpoint=f"{FIRST_HOST}:{port}",
                                                 log_dir=str(folder / "ranks")), rdzv_port=port,
                        time_limit_min=int(params["time"]), bindir=str(Path(defaults.python).parent),
                        env={k: v for k, v in environ.items() if k not in secret},
                        secrets={k: SecretStr(v) for k, v in environ.items() if k in secret})
    return SlurmSubmission(folder=str(folder), python=defaults.python, parameters=params,
                           sbatch_script=sbatch_script(defaults.python, folder, params), launch=launch)
