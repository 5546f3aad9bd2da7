"""Runs last: the 1-minute-limit job was submitted at the start of the session (conftest), because Slurm
enforces time limits only about every 30 s."""

from __future__ import annotations

from tests.slurm.conftest import TERMINAL, sacct_states, wait_for
from workers.backends.base import Handle, RunState
from workers.backends.slurm import SlurmBackend


def test_a_time_limit_kill_is_reported_as_timeout(backend: SlurmBackend, time_limit_job: Handle) -> None:
    obs = wait_for(backend, time_limit_job, lambda o: o.state in TERMINAL, timeout=150)
    assert obs.state == RunState.FAILED and obs.failure == "timeout", obs
    assert "time limit" in (obs.reason or "")
    assert time_limit_job.backend_id is not None and sacct_states(time_limit_job.backend_id) == ["TIMEOUT"]
    assert obs.log_tail is not None and "sleeping" in obs.log_tail
