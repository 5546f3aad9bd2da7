"""SlurmBackend against the real local cluster (two slurmd nodes): render, submit, poll, find, cancel,
failures, preemption requeues, batching. The time-limit tests are in test_time_limit.py."""

from __future__ import annotations

import functools
import json
import pickle
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cloudpickle  # type: ignore[import-untyped]
import pytest
import submitit
from pydantic import SecretStr, ValidationError
from submitit.core.utils import FailedJobError

from service.backend_options import LocalOptions, SlurmOptions, time_limit_minutes
from service.jobenv import PLAN, TOKEN, JobEnv
from tests.slurm.conftest import (
    TERMINAL,
    URGENT,
    launch_request,
    py,
    sacct_count_by_name,
    sacct_states,
    tiny_plan,
    wait_for,
)
from workers.backends.base import (
    LOG_ENV,
    Backend,
    BackendUnavailable,
    Handle,
    LaunchRequest,
    Observation,
    RunState,
    SubmissionRefused,
    TransientBackendError,
)
from workers.backends.slurm import SlurmBackend, SlurmObservation
from workers.backends.slurm.launcher import FIRST_HOST, NodeLauncher
from workers.backends.slurm.logs import log_files
from workers.backends.slurm.nodelist import expand_nodelist
from workers.backends.slurm.submission import rdzv_port

GOLDEN = Path(__file__).parent / "golden" / "render.json"
SECRETS = ("job-token-42-3", "hunter2")


def golden_request() -> LaunchRequest:
    return LaunchRequest(
        job=JobEnv(job_id=42, attempt=3, plan=tiny_plan(), api_url="https://shardctl.example:8443",
                   token=SecretStr(SECRETS[0])),
        name="shardctl-42-3", team="vision", nodes=2, procs_per_node=4, gpus_per_proc=1,
        command=["python", "-m", "workers.runtime"], user_env={"WANDB_MODE": "offline", "DB_PASSWORD": SECRETS[1]},
        options=SlurmOptions(kind="slurm", partition="gpu", account="ml", qos="high", time_limit="1-02:00:30",
                             sbatch=["--exclusive", "--constraint=h100"]))


def golden_backend(calls: list[list[str]] | None = None) -> SlurmBackend:
    return SlurmBackend(folder=Path("/srv/shardctl/slurm"), python="/opt/shardctl/bin/python",
                        runner=lambda args, **kw: (calls if calls is not None else []).append(args))  # type: ignore


# -- no cluster needed -----------------------------------------------------------------------------

def test_render_matches_the_golden_file_and_submits_nothing() -> None:
    calls: list[list[str]] = []
    backend = golden_backend(calls)
    rendered = backend.render(golden_request())
    assert isinstance(backend, Backend)
    assert rendered.backend == "slurm" and rendered.name == "shardctl-42-3"
    assert json.loads(rendered.model_dump_json()) == json.loads(GOLDEN.read_text())
    assert calls == [] and backend.calls == Counter()
    script = rendered.content["sbatch_script"]
    for line in ("#SBATCH --job-name=shardctl-42-3", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1",
                 "#SBATCH --gpus-per-node=4", "#SBATCH --cpus-per-task=4", "#SBATCH --partition=gpu",
                 "#SBATCH --account=ml", "#SBATCH --qos=high", "#SBATCH --time=1561", "#SBATCH --exclusive",
                 "#SBATCH --constraint=h100", "#SBATCH --chdir=/srv/shardctl/slurm/shardctl-42-3"):
        assert line in script.splitlines()
    assert f"--rdzv-endpoint={FIRST_HOST}:" in " ".join(rendered.content["launch"]["command"])


@pytest.mark.parametrize(("limit", "signal"), [("00:01:00", "USR2@30"), ("00:02:00", "USR2@60"),
                                               ("1-02:00:30", "USR2@60")])
def test_the_time_limit_signal_comes_at_most_halfway_through_the_limit(limit: str, signal: str) -> None:
    """Asked for at most halfway; Slurm may send it up to 60 s earlier still, as early as the job starts,
    which the launcher survives (test_time_limit.py)."""
    req = golden_request()
    req = req.model_copy(update={"options": req.options.model_copy(update={"time_limit": limit})})
    script = golden_backend().render(req).content["sbatch_script"]
    assert f"#SBATCH --signal={signal}" in script.splitlines()


def test_render_is_the_submission_with_its_secrets_redacted_and_its_plan_left_out() -> None:
    """One path: `render` serialises the very object `submit` sends; only the serialisation hides things."""
    backend, req = golden_backend(), golden_request()
    submission = backend.submission(req)
    rendered = backend.render(req).content
    assert rendered == submission.model_dump(mode="json")
    text = json.dumps(rendered)
    assert not any(secret in text for secret in SECRETS) and PLAN not in text
    assert rendered["launch"]["secrets"] == {TOKEN: "<redacted>", "DB_PASSWORD": "<redacted>"}
    # what the nodes get: everything the request says a rank gets, secrets and plan included
    sent = submission.launch.environment({"PATH": "/usr/bin"})
    assert {k: sent[k] for k in req.environment(out_dir="/srv/shardctl/slurm/shardctl-42-3/out")} == \
        req.environment(out_dir="/srv/shardctl/slurm/shardctl-42-3/out")
    assert sent[TOKEN] == SECRETS[0] and sent["DB_PASSWORD"] == SECRETS[1]
    assert JobEnv.from_environ(sent).plan == req.plan
    assert sent["PATH"] == "/opt/shardctl/bin:/usr/bin"
    # nothing else (no SHARDCTL_PLAN_FILE) but what makes the output readable live (rank prefixes, unbuffered)
    # and the job's checkpoint folder, shared by all its attempts
    assert set(sent) == {*req.environment(), *LOG_ENV, "SHARDCTL_OUT_DIR", "SHARDCTL_CHECKPOINT_DIR", "PATH"}
    assert sent["SHARDCTL_CHECKPOINT_DIR"] == "/srv/shardctl/slurm/checkpoints/job-42"
    # ... and they survive submitit's pickle (cloudpickle), which is how they travel
    launcher = pickle.loads(cloudpickle.dumps(NodeLauncher(submission.launch)))
    assert launcher.launch.environment({})[TOKEN] == SECRETS[0]
    endpoints = [arg for arg in launcher.launch.command_on("node7") if arg.startswith("--rdzv-endpoint=")]
    assert endpoints == [f"--rdzv-endpoint=node7:{submission.launch.rdzv_port}"]


def test_rendezvous_ports_stay_out_of_the_ephemeral_range() -> None:
    """A port an outgoing connection may hold (Linux's default 32768-60999) fails torchrun's bind."""
    ports = {rdzv_port(Path(f"/srv/shardctl/slurm/shardctl-{job}-{n}")) for job in range(500) for n in (1, 2)}
    assert len(ports) > 900 and min(ports) >= 20000 and max(ports) < 32768


def test_cpu_jobs_ask_for_no_gpus_and_sbatch_flags_replace_or_add() -> None:
    backend = SlurmBackend(folder=Path("/srv/x"))
    req = launch_request(py("pass"), procs_per_node=2)
    params = backend.submission(req).parameters
    assert "gpus_per_node" not in params and params["cpus_per_task"] == 2 and params["time"] == 60
    req = launch_request(py("pass"), sbatch=["--cpus-per-task=3", "--mem=4G", "--foo-bar=x", "--exclusive"])
    submission = backend.submission(req)
    assert submission.parameters["cpus_per_task"] == 3
    assert submission.parameters["additional_parameters"] == {
        "mem": "4G", "foo_bar": "x", "exclusive": True, "chdir": str(backend.folder / req.name)}
    lines = submission.sbatch_script.splitlines()
    for line in ("#SBATCH --cpus-per-task=3", "#SBATCH --mem=4G", "#SBATCH --foo-bar=x", "#SBATCH --exclusive"):
        assert lines.count(line) == 1, line
    assert sum(line.startswith("#SBATCH --cpus-per-task") for line in lines) == 1


def test_options_are_checked_before_the_backend_and_other_kinds_are_refused() -> None:
    """The API validates `SlurmOptions` at submit; the backend only refuses another backend's options."""
    with pytest.raises(ValidationError, match="long form"):
        SlurmOptions(kind="slurm", sbatch=["-x node1"])
    with pytest.raises(ValidationError, match="sets --nodes itself"):
        SlurmOptions(kind="slurm", sbatch=["--nodes=3"])
    backend = SlurmBackend(folder=Path("/srv/x"))
    req = launch_request(py("pass")).model_copy(update={"options": LocalOptions()})
    for call in (backend.render, backend.submit):
        with pytest.raises(SubmissionRefused, match="got local options"):
            call(req)
    with pytest.raises(ValueError, match="time limit"):
        SlurmBackend(folder=Path("/srv/x"), default_time_limit="1h")
    assert time_limit_minutes("00:01:00") == 1 and time_limit_minutes("2-00:00") == 2880
    assert expand_nodelist("node[1-2],gpu[007-009,12],login") == [
        "node1", "node2", "gpu007", "gpu008", "gpu009", "gpu12", "login"]
    assert expand_nodelist("None assigned") == []


@pytest.mark.parametrize(("stderr", "error"), [
    ("sbatch: error: Batch job submission failed: Invalid partition name specified", SubmissionRefused),
    ("sbatch: error: Batch job submission failed: Resource temporarily unavailable", TransientBackendError),
    ("sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)",
     BackendUnavailable),
])
def test_sbatch_failures_map_to_the_three_backend_errors(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                         stderr: str, error: type[Exception]) -> None:
    """What sbatch says, through submitit's FailedJobError (its stderr), decides which of the three it is."""
    def refuse(self: submitit.SlurmExecutor, fn: Any) -> Any:
        raise FailedJobError(stderr)

    monkeypatch.setattr(submitit.SlurmExecutor, "affinity", classmethod(lambda cls: 2))  # no srun needed
    monkeypatch.setattr(submitit.SlurmExecutor, "submit", refuse)
    backend = SlurmBackend(folder=tmp_path)
    with pytest.raises(error, match=stderr.split(": ")[-1].split(" (")[0]):
        backend.submit(launch_request(py("pass")))
    assert backend.calls == {"sbatch": 1}


def test_an_unreachable_controller_raises_backend_unavailable(tmp_path: Path) -> None:
    """Real sacct/squeue/scancel pointed at ports where nothing listens."""
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=nowhere\nSlurmctldHost=localhost\nSlurmctldPort=9\nAuthType=auth/munge\n"
                    "AccountingStorageType=accounting_storage/slurmdbd\nAccountingStoragePort=9\n"
                    "MessageTimeout=2\nNodeName=n1 CPUs=1\nPartitionName=p Nodes=n1\n")
    runner = functools.partial(subprocess.run, env={"SLURM_CONF": str(conf), "PATH": "/usr/bin:/bin"})
    backend = SlurmBackend(folder=tmp_path, runner=runner, command_timeout_s=15)
    handle = Handle(name="shardctl-1-1", backend_id="1")
    for call in (lambda: backend.poll([handle]), lambda: backend.find("shardctl-1-1"),
                 lambda: backend.cancel(handle)):
        with pytest.raises(BackendUnavailable):
            call()


# -- against the cluster ----------------------------------------------------------------------------

def node_logs(backend: SlurmBackend, handle: Handle) -> str:
    return "\n".join(p.read_text() for p in log_files(backend.job_folder(handle.name), handle.backend_id))


def test_a_two_node_job_succeeds_and_reports_both_nodes(backend: SlurmBackend) -> None:
    code = ("import os; from service.jobenv import JobEnv; e = JobEnv.from_environ(os.environ); print('rank',"
            " os.environ['RANK'], 'of', os.environ['WORLD_SIZE'], 'node', os.environ['SLURMD_NODENAME'], 'job',"
            " e.job_id, e.token is not None and e.token.get_secret_value() == 'test-job' + '-token',"
            " e.plan.name, e.out_dir, flush=True)")
    req = launch_request(py(code), nodes=2, procs_per_node=2)
    handle = backend.submit(req)
    assert handle.backend_id and handle.backend_id.isdigit()
    # sbatch got exactly the script the dry run shows
    folder = backend.job_folder(req.name)
    assert (folder / f"{handle.backend_id}_submission.sh").read_text() == backend.render(req).content["sbatch_script"]
    running = wait_for(backend, handle, lambda o: o.state != RunState.PENDING)
    obs = wait_for(backend, handle, lambda o: o.state in TERMINAL)
    assert obs.state == RunState.SUCCEEDED, obs
    assert obs.exit_code == 0 and obs.nodes == ["node1", "node2"]
    assert running.state in (RunState.RUNNING, RunState.SUCCEEDED)
    lines = node_logs(backend, handle)
    for rank in range(4):
        assert f"rank {rank} of 4" in lines
    contract = f"job {req.job_id} True {tiny_plan().name} {folder / 'out'}"
    assert f"node node1 {contract}" in lines and f"node node2 {contract}" in lines
    assert "test-job-token" not in lines  # the launcher does not print the environment
    assert sacct_states(handle.backend_id) == ["COMPLETED"]


def sacct_nodelist(job_id: str | None) -> str:
    return subprocess.run(["sacct", "-n", "-P", "-X", "-j", str(job_id), "-o", "NodeList"], capture_output=True,
                          text=True, check=True).stdout.strip()


def test_the_lagging_moments_of_a_finished_job_read_as_running_on_all_its_nodes(backend: SlurmBackend) -> None:
    """Three windows the real cluster opens for a second or two, replayed on its real output: sacct
    has not recorded a finished job yet; sacct has, on its batch host alone (NNodes already 2); squeue
    lists only the nodes still completing. None may give a verdict early or lose a node."""
    handle = backend.submit(launch_request(py("print('ok')"), nodes=2, procs_per_node=1))
    done = wait_for(backend, handle, lambda o: o.state in TERMINAL)
    assert done.state == RunState.SUCCEEDED and done.nodes == ["node1", "node2"]
    deadline = time.monotonic() + 30
    while sacct_nodelist(handle.backend_id) != "node[1-2]":  # settled, so each replay starts alike
        assert time.monotonic() < deadline, sacct_nodelist(handle.backend_id)
        time.sleep(0.3)

    def replay(sacct: Callable[[str], str], squeue: Callable[[str], str]) -> Observation:
        def runner(args: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
            real = subprocess.run(args, **kw)
            out = {"sacct": sacct, "squeue": squeue}.get(args[0], str)(real.stdout)
            return subprocess.CompletedProcess(args, real.returncode, out, real.stderr)

        return SlurmBackend(folder=backend.folder, runner=runner).poll([handle])[handle.name]

    def same(out: str) -> str:
        return out

    not_yet = replay(lambda out: "", same)
    assert not_yet.state == RunState.RUNNING and not_yet.exit_code is None
    batch_host_only = replay(lambda out: out.replace("|node[1-2]|", "|node1|"), same)
    assert batch_host_only.state == RunState.SUCCEEDED and batch_host_only.nodes == ["node1", "node2"]
    nowhere_complete = replay(lambda out: out.replace("|node[1-2]|", "|node1|"),
                              lambda out: out.replace("|node[1-2]|", "|node1|"))
    assert nowhere_complete.state == RunState.RUNNING and nowhere_complete.exit_code is None
    completing = replay(lambda out: out.replace("|COMPLETED|", "|RUNNING|"),
                        lambda out: out.replace("|COMPLETED|node[1-2]|", "|COMPLETING|node1|"))
    assert completing.state == RunState.RUNNING and completing.nodes == ["node1", "node2"]


def test_a_failing_program_is_failed_with_its_exit_code_and_log_tail(backend: SlurmBackend) -> None:
    code = "import os, sys; print('loss is nan on rank', os.environ['RANK'], flush=True); sys.exit(3)"
    handle = backend.submit(launch_request(py(code), nodes=2))
    obs = wait_for(backend, handle, lambda o: o.state in TERMINAL)
    assert obs.state == RunState.FAILED and obs.failure == "program_error", obs
    assert obs.exit_code == 3
    assert obs.log_tail is not None and "loss is nan on rank" in obs.log_tail
    assert "ChildFailedError" not in obs.log_tail and "Root Cause" not in obs.log_tail  # the program's lines only
    assert obs.nodes == ["node1", "node2"]


def test_cancel_is_idempotent_and_sacct_agrees(backend: SlurmBackend) -> None:
    handle = backend.submit(launch_request(py("import time; time.sleep(300)"), nodes=2))
    wait_for(backend, handle, lambda o: o.state == RunState.RUNNING)
    backend.cancel(handle)
    obs = wait_for(backend, handle, lambda o: o.state in TERMINAL, timeout=30)
    assert obs.state == RunState.CANCELLED and obs.failure == "cancelled"
    backend.cancel(handle)  # again: a finished job is fine
    backend.cancel(Handle(name="shardctl-0-0", backend_id="99999999"))  # unknown id: fine too
    assert handle.backend_id is not None and sacct_states(handle.backend_id) == ["CANCELLED"]


def test_sbatch_refusing_a_request_is_a_submission_refused(backend: SlurmBackend) -> None:
    with pytest.raises(SubmissionRefused, match=r"(?i)invalid partition"):
        backend.submit(launch_request(py("pass"), nodes=1, partition="no-such-partition"))


def test_find_adopts_by_name_and_cancel_works_by_name(backend: SlurmBackend) -> None:
    req = launch_request(py("import time; time.sleep(300)"), nodes=1)
    assert backend.find(req.name) is None
    # the same name submitted by someone else (another data dir, an old install): never adopted
    subprocess.run(["sbatch", "-o", "/dev/null", "-J", req.name, "-t", "1", "--wrap", "true"], check=True,
                   capture_output=True)
    assert backend.find(req.name) is None
    handle = backend.submit(req)
    assert backend.find(req.name) == handle  # right after sbatch (squeue), before sacct may know it
    backend.cancel(Handle(name=req.name))  # no id: scancel --name
    wait_for(backend, handle, lambda o: o.state == RunState.CANCELLED, timeout=30)
    assert backend.find(req.name) == handle  # finished, still in squeue (MinJobAge)
    deadline = time.monotonic() + 20
    while sacct_count_by_name(req.name) < 2 and time.monotonic() < deadline:
        time.sleep(0.3)  # accounting reaches slurmdbd a moment after the job ends
    assert sacct_count_by_name(req.name) == 2  # ours and the stranger's

    def squeue_forgot(args: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        """squeue as after MinJobAge (the job purged from slurmctld); sacct real."""
        if args[0] == "squeue":
            return subprocess.CompletedProcess(args, 0, "", "")
        return subprocess.run(args, **kw)

    assert SlurmBackend(folder=backend.folder, runner=squeue_forgot).find(req.name) == handle


def test_poll_of_many_handles_makes_one_sacct_call(backend: SlurmBackend, partition: str) -> None:
    names = [f"shardctl-poll-{time.time_ns()}-{i}" for i in range(40)]
    handles = []
    for name in names[:30]:
        out = subprocess.run(["sbatch", "--parsable", "-o", "/dev/null", "-p", partition, "-J", name, "-t", "1",
                              "--wrap", "true"], capture_output=True, text=True, check=True).stdout
        handles.append(Handle(name=name, backend_id=out.strip().split(";")[0]))
    handles += [Handle(name=name, backend_id=str(90_000_000 + i)) for i, name in enumerate(names[30:])]
    calls: Counter[str] = Counter()

    def counting(args: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        calls[args[0]] += 1
        return subprocess.run(args, **kw)

    counted = SlurmBackend(folder=backend.folder, runner=counting)
    deadline = time.monotonic() + 60
    while True:
        calls.clear()
        observed = counted.poll(handles)
        assert calls["sacct"] == 1 and calls["squeue"] <= 1 and sum(calls.values()) <= 2, calls
        states = Counter(observed[h.name].state for h in handles)
        if states[RunState.SUCCEEDED] == 30 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert states == {RunState.SUCCEEDED: 30, RunState.MISSING: 10}, states
    calls.clear()
    counted.poll([Handle(name=h.name) for h in handles])  # ids unknown: still one lookup by name
    assert calls == {"sacct": 1} or calls == {"sacct": 1, "squeue": 1}, calls


@pytest.fixture
def long_job(backend: SlurmBackend) -> Iterator[Handle]:
    """A running job holding 3 of the 4 CPUs of both nodes, so an urgent job that needs 2 per node must
    preempt it. Cancelled, and seen cancelled, afterwards. It waits up to 4 minutes to start: the two
    time-limit jobs the session starts first may hold 2 CPUs of one node until Slurm kills them (60-90 s
    after the session starts, later on a loaded machine), and CI's cluster may still be busy."""
    handle = backend.submit(launch_request(py("import time; print('started', flush=True); time.sleep(300)"),
                                           nodes=2, sbatch=["--cpus-per-task=3"]))
    try:
        wait_for(backend, handle, lambda o: o.state == RunState.RUNNING, timeout=240)
        yield handle
    finally:
        backend.cancel(handle)
    wait_for(backend, handle, lambda o: o.state == RunState.CANCELLED, timeout=30)


def test_partition_preemption_requeues_and_is_reported(backend: SlurmBackend, long_job: Handle) -> None:
    assert long_job.backend_id is not None
    subprocess.run(["sbatch", "-o", "/dev/null", "-p", URGENT, "-N2", "--cpus-per-task=2", "-J", "shardctl-test-urgent",
                    "-t", "1", "--wrap", "sleep 1"], check=True, capture_output=True)
    obs = wait_for(backend, long_job, lambda o: isinstance(o, SlurmObservation) and o.requeues >= 1)
    assert isinstance(obs, SlurmObservation)
    assert obs.state in (RunState.PENDING, RunState.RUNNING)
    assert obs.requeue_reasons[0].startswith("preempted") and "requeued 1x: preempted" in (obs.reason or "")
    assert sacct_states(long_job.backend_id)[0] == "PREEMPTED"


def test_submitit_signal_requeues_through_the_checkpointable_launcher(backend: SlurmBackend, long_job: Handle) -> None:
    assert long_job.backend_id is not None
    # The launcher installs its handler before it starts the program, so once every rank has printed
    # the signal reaches a handler (a fixed sleep was too short on a loaded machine: USR2 killed it).
    deadline, cursor, ranks = time.monotonic() + 90, None, set()
    while ranks != {0, 1}:
        assert time.monotonic() < deadline, f"ranks that printed: {sorted(ranks)}"
        chunk = backend.read_logs(long_job, rank=None, cursor=cursor, limit=500)
        ranks |= {x.rank for x in chunk.lines if x.line == "started" and x.rank is not None}
        cursor = chunk.next_cursor
        time.sleep(0.2)
    subprocess.run(["scancel", "--signal=USR2", long_job.backend_id], check=True)
    obs = wait_for(backend, long_job, lambda o: isinstance(o, SlurmObservation) and o.requeues >= 1)
    assert isinstance(obs, SlurmObservation) and obs.requeue_reasons[0].startswith("requeued")
    assert sacct_states(long_job.backend_id)[0] == "REQUEUED"
