"""A job never runs twice at once on the local backend: when an attempt's supervisor dies, what it
started is stopped before the retry starts, and the checkpoint folder has one writer at a time."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from pathlib import Path

from tests.db_fixtures import Env
from tests.specs import tiny
from tests.support.dispatch import drive, make_dispatcher
from workers.backends import local_strays


def running_copies(marker: str) -> dict[int, str]:
    """{pid: attempt} of every rank of the program carrying `marker` (torchrun's agents left out: their
    command line carries the program's too, but only a rank has RANK in its environment)."""
    out: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker.encode() not in (entry / "cmdline").read_bytes():
                continue
            env = dict(kv.split(b"=", 1) for kv in (entry / "environ").read_bytes().split(b"\0") if b"=" in kv)
            state = (entry / "stat").read_text().rsplit(") ", 1)[1][:1]
        except OSError:
            continue
        if b"RANK" in env and state != "Z":
            out[int(entry.name)] = env.get(b"SHARDCTL_ATTEMPT", b"?").decode()
    return out


class Watch:
    """Samples the running copies every 0.2 s (the issue asks for every second) and keeps every sample
    in which ranks of more than one attempt ran at once."""

    def __init__(self, marker: str) -> None:
        self.marker, self.overlaps, self.seen = marker, [], set()  # type: ignore[var-annotated]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            copies = running_copies(self.marker)
            self.seen.update(copies.values())
            if len(set(copies.values())) > 1:
                self.overlaps.append(copies)
            time.sleep(0.2)


def test_after_kill_9_of_a_supervisor_one_copy_at_most_runs_at_any_moment(env: Env, admin: dict[str, str],
                                                                          tmp_path: Path) -> None:
    marker = f"one-writer-{uuid.uuid4().hex[:8]}"
    program = f"import time  # {marker}\nwhile True:\n    time.sleep(0.1)\n"
    spec = tiny(entrypoint={"command": ["python", "-c", program]})  # two ranks under torchrun
    job_id = env.client.post("/v1/jobs", json=spec, headers=admin).json()["id"]
    dispatcher = make_dispatcher(env, tmp_path)
    drive(env, dispatcher, job_id, admin, until={"RUNNING"})
    deadline = time.monotonic() + 60
    while len(running_copies(marker)) < 2:
        assert time.monotonic() < deadline, "the ranks did not start"
        time.sleep(0.1)
    watch = Watch(marker)
    try:
        state = json.loads((tmp_path / f"shardctl-{job_id}-1" / "state.json").read_text())
        os.kill(state["pid"], signal.SIGKILL)  # the supervisor alone: its agent and ranks go on as orphans
        deadline = time.monotonic() + 90
        while True:
            dispatcher.run_once()
            job = env.client.get(f"/v1/jobs/{job_id}", headers=admin).json()
            copies = running_copies(marker)
            if len(job["attempts"]) == 2 and len(copies) == 2 and set(copies.values()) == {"2"}:
                break
            assert time.monotonic() < deadline, f"no second attempt running: {job['status']}, {copies}"
            time.sleep(0.1)
        time.sleep(1.0)  # one more second of samples with the retry running
    finally:
        watch.stop.set()
        watch.thread.join()
    assert watch.overlaps == [], f"two attempts ran at once: {watch.overlaps[:3]}"
    assert watch.seen == {"1", "2"}
    assert job["attempts"][0]["exit_reason"].startswith("the local supervisor died")
    env.client.post(f"/v1/jobs/{job_id}/cancel", headers=admin)
    assert drive(env, dispatcher, job_id, admin)["status"] == "CANCELLED"
    deadline = time.monotonic() + 30
    while running_copies(marker):
        assert time.monotonic() < deadline, "the cancelled attempt's ranks still run"
        time.sleep(0.1)


def test_a_new_attempt_stops_an_earlier_one_and_holds_the_checkpoint_folder(tmp_path: Path) -> None:
    """What the retry's supervisor does even when nothing marked the earlier attempt lost (a dispatcher
    that died between the two): the earlier attempt's processes are stopped, then the lock is taken."""
    import subprocess
    import sys

    checkpoints = tmp_path / "checkpoints" / "job-7"
    checkpoints.mkdir(parents=True)
    env = {**os.environ, "SHARDCTL_CHECKPOINT_DIR": str(checkpoints), "SHARDCTL_ATTEMPT": "1"}
    lock = local_strays.hold_writer_lock(checkpoints)
    earlier = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env=env, pass_fds=(lock,))
    os.close(lock)  # as when the supervisor died: only its orphan holds the lock now
    other_job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                                 env={**env, "SHARDCTL_CHECKPOINT_DIR": str(tmp_path / "checkpoints" / "job-8")})
    try:
        try:
            local_strays.hold_writer_lock(checkpoints, wait_s=0.3)
            raise AssertionError("the lock was free while the earlier attempt ran")
        except TimeoutError:
            pass
        assert local_strays.processes(checkpoints, other_than=2) == [earlier.pid]
        assert local_strays.stop_earlier(checkpoints, 2) == [earlier.pid]
        assert earlier.wait(timeout=10) == -signal.SIGKILL
        os.close(local_strays.hold_writer_lock(checkpoints, wait_s=5))
        assert other_job.poll() is None  # another job's processes are left alone
    finally:
        for proc in (earlier, other_job):
            proc.kill()
            proc.wait()


def test_a_fifo_or_a_link_in_place_of_the_lock_file_neither_blocks_nor_is_followed(tmp_path: Path) -> None:
    """The job can write its checkpoint folder: what it leaves at the lock's name is replaced, never
    opened for good (a FIFO would block the next attempt's supervisor) or followed."""
    import stat

    checkpoints = tmp_path / "job-9"
    checkpoints.mkdir()
    os.mkfifo(checkpoints / local_strays.WRITER_LOCK)
    fd = local_strays.hold_writer_lock(checkpoints, wait_s=1)
    assert stat.S_ISREG(os.fstat(fd).st_mode)
    os.close(fd)
    (checkpoints / local_strays.WRITER_LOCK).unlink()
    target = tmp_path / "server-file"
    target.write_text("keep")
    (checkpoints / local_strays.WRITER_LOCK).symlink_to(target)
    os.close(local_strays.hold_writer_lock(checkpoints, wait_s=1))
    assert target.read_text() == "keep" and not (checkpoints / local_strays.WRITER_LOCK).is_symlink()
