"""The local backend's devices: each attempt holds a disjoint set (CUDA_VISIBLE_DEVICES, or CPU affinity on
the cpu kind), nothing starts beyond what the machine holds, and the allocation outlives the service."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests.db_fixtures import Env
from tests.specs import launch_request, tiny
from workers.backends import local_devices
from workers.backends.base import Handle, LaunchRequest, RunState, SubmissionRefused, TransientBackendError
from workers.backends.local import LocalBackend
from workers.backends.local_devices import LocalDevices
from workers.dispatch.context import DispatcherConfig
from workers.dispatcher import Dispatcher

#: Writes what the process sees (its CUDA_VISIBLE_DEVICES and CPU affinity) to OUT/<name>.json, then waits
#: (at most 60 s) until the file RELEASE exists, so the test decides when it ends.
SEE_AND_WAIT = ("import json, os, sys, time, pathlib; out = pathlib.Path(sys.argv[1]);"
                " (out / (sys.argv[2] + '.json')).write_text(json.dumps("
                "{'cuda': os.environ.get('CUDA_VISIBLE_DEVICES'),"
                " 'cpus': sorted(os.sched_getaffinity(0))}));"
                " end = time.monotonic() + 60\n"
                "while not (out / 'RELEASE').exists() and time.monotonic() < end: time.sleep(0.05)")


def program(marks: Path, name: str) -> list[str]:
    return ["python", "-c", SEE_AND_WAIT, str(marks), name]


def gpu_request(name: str, marks: Path, gpus: int, job_id: int) -> LaunchRequest:
    """One process holding `gpus` GPUs (the planner's world does not matter to the backend)."""
    req = launch_request(name, program(marks, name), job_id=job_id)
    return req.model_copy(update={"gpus_per_proc": gpus})


def seen(marks: Path, name: str, timeout: float = 60) -> dict[str, object]:
    path = marks / f"{name}.json"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return json.loads(path.read_text())  # type: ignore[no-any-return]
        time.sleep(0.05)
    raise AssertionError(f"{name} never reported what it sees")


def wait(backend: LocalBackend, name: str, until: set[RunState], timeout: float = 60) -> RunState:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = backend.poll([Handle(name=name)])[name].state
        if state in until:
            return state
        time.sleep(0.1)
    raise AssertionError(f"{name} did not reach {until}")


@pytest.fixture
def marks(tmp_path: Path) -> Path:
    path = tmp_path / "marks"
    path.mkdir()
    return path


def test_gpu_attempts_see_disjoint_devices_and_never_more_than_the_machine_holds(tmp_path: Path,
                                                                                  marks: Path) -> None:
    backend = LocalBackend(tmp_path / "local", LocalDevices.parse("gpu:0,1,2,3"))
    backend.submit(gpu_request("shardctl-1-1", marks, 2, 1))
    backend.submit(gpu_request("shardctl-2-1", marks, 2, 2))
    first, second = seen(marks, "shardctl-1-1"), seen(marks, "shardctl-2-1")
    assert isinstance(first["cuda"], str) and isinstance(second["cuda"], str)
    a, b = set(first["cuda"].split(",")), set(second["cuda"].split(","))
    assert len(a) == len(b) == 2 and not a & b and a | b == {"0", "1", "2", "3"}
    with pytest.raises(TransientBackendError, match="0 of 4 are free"):
        backend.submit(gpu_request("shardctl-3-1", marks, 1, 3))
    assert backend.find("shardctl-3-1") is None  # nothing was started, nothing claimed
    with pytest.raises(SubmissionRefused, match="has 4 GPU"):
        backend.submit(gpu_request("shardctl-4-1", marks, 5, 4))
    (marks / "RELEASE").touch()
    for name in ("shardctl-1-1", "shardctl-2-1"):
        assert wait(backend, name, {RunState.SUCCEEDED, RunState.FAILED}) == RunState.SUCCEEDED
    (marks / "RELEASE").unlink()
    backend.submit(gpu_request("shardctl-3-1", marks, 4, 3))  # all four are free again
    third = seen(marks, "shardctl-3-1")
    assert isinstance(third["cuda"], str) and set(third["cuda"].split(",")) == {"0", "1", "2", "3"}
    (marks / "RELEASE").touch()
    wait(backend, "shardctl-3-1", {RunState.SUCCEEDED})


def test_the_server_s_own_cuda_visible_devices_is_replaced(tmp_path: Path, marks: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")  # inherited by the supervisor: the assignment must win
    backend = LocalBackend(tmp_path / "local", LocalDevices.parse("gpu:2,3"))
    backend.submit(gpu_request("shardctl-1-1", marks, 1, 1))
    assert seen(marks, "shardctl-1-1")["cuda"] == "2"
    (marks / "RELEASE").touch()
    wait(backend, "shardctl-1-1", {RunState.SUCCEEDED})


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to show pinning")
def test_cpu_attempts_are_pinned_to_cores_of_their_own_and_see_no_gpu(tmp_path: Path, marks: Path) -> None:
    cores = sorted(os.sched_getaffinity(0))[:2]
    backend = LocalBackend(tmp_path / "local", LocalDevices.parse(f"gpu:0;cpu:{cores[0]},{cores[1]}"))
    for n in (1, 2):
        backend.submit(launch_request(f"shardctl-{n}-1", program(marks, f"shardctl-{n}-1"), job_id=n))
    first, second = seen(marks, "shardctl-1-1"), seen(marks, "shardctl-2-1")
    assert sorted([first["cpus"], second["cpus"]]) == [[cores[0]], [cores[1]]]  # type: ignore[type-var]
    assert first["cuda"] == second["cuda"] == ""
    with pytest.raises(TransientBackendError):
        backend.submit(launch_request("shardctl-3-1", program(marks, "shardctl-3-1"), job_id=3))
    (marks / "RELEASE").touch()
    for name in ("shardctl-1-1", "shardctl-2-1"):
        wait(backend, name, {RunState.SUCCEEDED})


def test_the_allocation_outlives_the_service(tmp_path: Path, marks: Path) -> None:
    """A new backend on the same folder (a restarted service, or a second dispatcher) sees what the live
    attempts hold: it reads their devices.json under the same lock."""
    LocalBackend(tmp_path / "local", LocalDevices.parse("gpu:0,1")).submit(gpu_request("shardctl-1-1", marks, 2, 1))
    seen(marks, "shardctl-1-1")
    restarted = LocalBackend(tmp_path / "local", LocalDevices.parse("gpu:0,1"))
    with pytest.raises(TransientBackendError):
        restarted.submit(gpu_request("shardctl-2-1", marks, 1, 2))
    (marks / "RELEASE").touch()
    wait(restarted, "shardctl-1-1", {RunState.SUCCEEDED})
    restarted.submit(gpu_request("shardctl-2-1", marks, 1, 2))
    assert seen(marks, "shardctl-2-1")["cuda"] in {"0", "1"}
    wait(restarted, "shardctl-2-1", {RunState.SUCCEEDED})


def test_a_job_that_needs_every_device_waits_in_the_queue_until_the_first_ends(env: Env, admin: dict[str, str],
                                                                                 tmp_path: Path,
                                                                                 marks: Path) -> None:
    """Through the API and the dispatcher: two jobs each needing the machine's only (configured) CPU slot.
    The second is not started while the first runs; it starts once the first has finished."""
    core = sorted(os.sched_getaffinity(0))[-1]
    backend = LocalBackend(tmp_path / "local", LocalDevices.parse(f"cpu:{core}"))
    dispatcher = Dispatcher(env.app.state.sessions, {"local": backend}, DispatcherConfig(retry_backoff_s=0.1))
    ids = []
    for n in (1, 2):
        spec = tiny(resources={"gpus_per_node": 1}, entrypoint={"command": program(marks, f"job{n}")})
        ids.append(env.client.post("/v1/jobs", json=spec, headers=admin).json()["id"])

    def status(job_id: int) -> str:
        return str(env.client.get(f"/v1/jobs/{job_id}", headers=admin).json()["status"])

    deadline = time.monotonic() + 60
    while not (marks / "job1.json").exists() and time.monotonic() < deadline:
        dispatcher.run_once()
        time.sleep(0.1)
    for _ in range(10):  # several cycles while the first runs: the second never starts
        dispatcher.run_once()
        time.sleep(0.1)
    assert seen(marks, "job1")["cpus"] == [core]
    assert not (marks / "job2.json").exists() and status(ids[1]) in {"QUEUED", "SUBMITTING"}
    events = [e["message"] for e in env.client.get(f"/v1/jobs/{ids[1]}/events", headers=admin).json()]
    assert any("could not take the submission now" in (m or "") for m in events)
    (marks / "RELEASE").touch()
    deadline = time.monotonic() + 90
    while status(ids[1]) != "SUCCEEDED" and time.monotonic() < deadline:
        dispatcher.run_once()
        time.sleep(0.1)
    assert status(ids[0]) == status(ids[1]) == "SUCCEEDED"
    assert seen(marks, "job2")["cpus"] == [core]


def test_devices_of_an_attempt_whose_supervisor_is_gone_are_free_again(tmp_path: Path) -> None:
    """After a crash or a reboot: a supervisor that died, or whose pid now belongs to a process started
    later (pid reuse), holds nothing; a live supervisor keeps its devices."""
    folder = tmp_path / "local"
    folder.mkdir()
    req = launch_request("shardctl-1-1", ["true"]).model_copy(update={"gpus_per_proc": 2})
    devices = LocalDevices.parse("gpu:0,1")
    attempt = folder / "shardctl-1-1"
    attempt.mkdir()
    local_devices.claim(folder, attempt, req, devices)

    def state(pid: int, started_at: float) -> None:
        (attempt / "state.json").write_text(json.dumps({"pid": pid, "pgid": pid, "started_at": started_at}))

    state(os.getpid(), time.time())  # this process stands in for a live supervisor
    assert local_devices.in_use(folder)["gpu"] == {"0", "1"}
    state(os.getpid(), time.time() - 86_400)  # the recorded supervisor started a day ago: this pid is another
    assert local_devices.in_use(folder)["gpu"] == set()
    state(2**22 + 7, time.time())  # no such process
    assert local_devices.in_use(folder)["gpu"] == set()
