"""SlurmBackend against the real local cluster (two slurmd nodes): render, submit, poll, find, cancel,
failures, preemption requeues, batching. The time-limit test is in test_zz_time_limit.py (runs last)."""

from __future__ import annotations

import functools
import json
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.slurm.conftest import TERMINAL, URGENT, launch_request, py, sacct_count_by_name, sacct_states, wait_for
from workers.backends.base import Backend, BackendUnavailable, Handle, LaunchRequest, Observation, RunState
from workers.backends.slurm import SlurmBackend, SlurmObservation, expand_nodelist, time_limit_minutes

GOLDEN = Path(__file__).parent / "golden" / "render.json"


def golden_request() -> LaunchRequest:
    return LaunchRequest(
        job_id=42, attempt=3, name="shardctl-42-3", nodes=2, procs_per_node=4, gpus_per_proc=1,
        command=["python", "-m", "workers.runtime"], env={"SHARDCTL_JOB_ID": "42"}, plan={"layout": {"dp": 8}},
        spec={"backend": {"kind": "slurm", "partition": "gpu", "account": "ml", "qos": "high",
                          "time_limit": "1-02:00:30", "sbatch": ["--exclusive", "--constraint=h100"]}},
        team="vision")


# -- no cluster needed -----------------------------------------------------------------------------

def test_render_matches_the_golden_file_and_submits_nothing() -> None:
    calls: list[list[str]] = []
    backend = SlurmBackend(folder=Path("/srv/shardctl/slurm"), python="/opt/shardctl/bin/python",
                           runner=lambda args, **kw: calls.append(args))  # type: ignore[arg-type]
    rendered = backend.render(golden_request())
    assert isinstance(backend, Backend)
    assert rendered.backend == "slurm" and rendered.name == "shardctl-42-3"
    assert json.loads(rendered.model_dump_json()) == json.loads(GOLDEN.read_text())
    assert calls == []
    script = rendered.content["sbatch_script"]
    for line in ("#SBATCH --job-name=shardctl-42-3", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1",
                 "#SBATCH --gpus-per-node=4", "#SBATCH --cpus-per-task=4", "#SBATCH --partition=gpu",
                 "#SBATCH --account=ml", "#SBATCH --qos=high", "#SBATCH --time=1561", "#SBATCH --exclusive",
                 "#SBATCH --constraint=h100"):
        assert line in script.splitlines()
    assert "--rdzv-endpoint=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n1):" in " ".join(
        rendered.content["per_node_command"])


def test_cpu_jobs_ask_for_no_gpus_and_options_are_validated() -> None:
    backend = SlurmBackend(folder=Path("/srv/x"))
    req = launch_request(py("pass"), procs_per_node=2)
    params = backend.parameters(req)
    assert "gpus_per_node" not in params and params["cpus_per_task"] == 2 and params["time"] == 60
    with pytest.raises(ValueError, match="long form"):
        backend.parameters(launch_request(py("pass"), sbatch=["-x node1"]))
    with pytest.raises(ValueError, match="sets --nodes itself"):
        backend.parameters(launch_request(py("pass"), sbatch=["--nodes=3"]))
    req = launch_request(py("pass"), sbatch=["--cpus-per-task=3", "--mem=4G", "--foo=x"])
    overridden = backend.parameters(req)
    assert overridden["cpus_per_task"] == 3 and overridden["mem"] == "4G"
    assert overridden["additional_parameters"] == {"foo": "x", "chdir": str(backend.folder / req.name)}
    assert time_limit_minutes("00:01:00") == 1 and time_limit_minutes("2-00:00") == 2880
    assert expand_nodelist("node[1-2],gpu[007-009,12],login") == [
        "node1", "node2", "gpu007", "gpu008", "gpu009", "gpu12", "login"]
    assert expand_nodelist("None assigned") == []


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

def test_a_two_node_job_succeeds_and_reports_both_nodes(backend: SlurmBackend) -> None:
    code = ("import os; print('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'], 'node',"
            " os.environ['SLURMD_NODENAME'], os.path.exists(os.environ['SHARDCTL_PLAN_FILE']), flush=True)")
    handle = backend.submit(launch_request(py(code), nodes=2, procs_per_node=2))
    assert handle.backend_id and handle.backend_id.isdigit()
    running = wait_for(backend, handle, lambda o: o.state != RunState.PENDING)
    obs = wait_for(backend, handle, lambda o: o.state in TERMINAL)
    assert obs.state == RunState.SUCCEEDED, obs
    assert obs.exit_code == 0 and obs.nodes == ["node1", "node2"]
    assert running.state in (RunState.RUNNING, RunState.SUCCEEDED)
    lines = "\n".join(backend.logs(handle, rank=0)) + "\n".join(backend.logs(handle, rank=3))
    for rank in range(4):
        assert f"rank {rank} of 4" in lines
    assert "node node1 True" in lines and "node node2 True" in lines
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
            out = {"sacct": sacct, "squeue": squeue}.get(args[0], lambda o: o)(real.stdout)
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
    assert obs.state == RunState.FAILED and obs.failure == "program", obs
    assert obs.exit_code == 3
    assert obs.log_tail is not None and "loss is nan on rank" in obs.log_tail and "exitcode  : 3" in obs.log_tail
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
    """A running job holding 3 of the 4 CPUs of both nodes (the time-limit job may hold 1 on node1), so
    an urgent job that needs 2 per node must preempt it. Cancelled, and seen cancelled, afterwards."""
    handle = backend.submit(launch_request(py("import time; print('started', flush=True); time.sleep(300)"),
                                           nodes=2, sbatch=["--cpus-per-task=3"]))
    try:
        wait_for(backend, handle, lambda o: o.state == RunState.RUNNING)
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
    time.sleep(2)  # the launcher has installed its handler once it printed
    subprocess.run(["scancel", "--signal=USR2", long_job.backend_id], check=True)
    obs = wait_for(backend, long_job, lambda o: isinstance(o, SlurmObservation) and o.requeues >= 1)
    assert isinstance(obs, SlurmObservation) and obs.requeue_reasons[0].startswith("requeued")
    assert sacct_states(long_job.backend_id)[0] == "REQUEUED"
