"""Slurm job states -> `RunState`: which states wait, run or end, and how an ending is classified.

`observe` turns the accounting records of ONE job id (oldest first: earlier records are runs that
Slurm requeued) into a `SlurmObservation`. It is pure: no CLI call, no file read (the log tail of a
failed job is the backend's to add).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from service.failures import FailureClass
from workers.backends.base import Observation, RunState
from workers.backends.evidence import memory_failure
from workers.backends.slurm.nodelist import expand_nodelist, nodes_complete

#: Slurm states of a job that has not started (or was put back in the queue)
WAITING = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "CONFIGURING"})
#: Slurm states of a job that holds its nodes
RUNNING = frozenset({"RUNNING", "COMPLETING", "SUSPENDED", "STAGE_OUT", "SIGNALING", "RESIZING", "STOPPED"})
#: Slurm states in which a job is not finished: squeue's view of these beats sacct's (which lags)
LIVE = WAITING | RUNNING
#: Slurm states of a job that was cancelled (by a user, or revoked by a federation)
CANCELLED = frozenset({"CANCELLED", "REVOKED"})
#: terminal Slurm states that are failures -> (failure class, words for the reason); any other
#: unknown terminal state is `lost`. FAILED is the program's own exit: the launcher exits with the
#: failing rank's exit code (not torchrun's 1), which sacct's `ExitCode` carries; OUT_OF_MEMORY is
#: the job's cgroup memory limit (host memory).
FAILED_STATES: Mapping[str, tuple[FailureClass, str]] = {
    "FAILED": (FailureClass.PROGRAM_ERROR, "the program failed"),
    "OUT_OF_MEMORY": (FailureClass.OOM_HOST, "out of host memory (the job's memory limit)"),
    "TIMEOUT": (FailureClass.TIMEOUT, "time limit reached"),
    "DEADLINE": (FailureClass.TIMEOUT, "deadline reached"),
    "NODE_FAIL": (FailureClass.NODE_FAILURE, "node failure"),
    "BOOT_FAIL": (FailureClass.NODE_FAILURE, "node boot failure"),
    "PREEMPTED": (FailureClass.PREEMPTED, "preempted (not requeued)"),
}


class SlurmObservation(Observation):
    """An `Observation` plus what only Slurm knows: its job id and state word."""

    job_id: str | None = None
    slurm_state: str | None = None


def state_word(state: str) -> str:
    """sacct's `State` without its suffix: `CANCELLED by 0` -> `CANCELLED`; empty -> `UNKNOWN`."""
    return state.split()[0] if state.strip() else "UNKNOWN"


def exit_code(value: str) -> tuple[int, int]:
    """sacct `ExitCode` "code:signal" -> (code, signal); (0, 0) when unreadable."""
    code, _, sig = value.partition(":")
    try:
        return int(code or 0), int(sig or 0)
    except ValueError:
        return 0, 0


def observe(records: Sequence[Mapping[str, str]]) -> SlurmObservation:
    """Map the records of one job id (oldest first, at least one; fields as in `accounting.SACCT_FIELDS`)
    to an observation. Earlier records are requeued runs: counted in `requeues` with their reasons.

    A SUCCEEDED or FAILED verdict needs a record that lists all the job's nodes: until accounting has
    them all the job reads RUNNING ("ended; Slurm is still recording it")."""
    cur = records[-1]
    slurm_state = state_word(cur["State"])
    earlier = records[:-1]
    requeue_reasons = [f"{state_word(r['State']).lower()} (run on {r['NodeList']})" for r in earlier]
    code, sig = exit_code(cur["ExitCode"])
    nodes = expand_nodelist(cur["NodeList"])
    reason: str | None = cur.get("Reason") or None
    if reason == "None":
        reason = None
    state: RunState
    failure: FailureClass | None = None
    exit_value: int | None = None
    if slurm_state in WAITING:
        state, nodes = RunState.PENDING, []
    elif slurm_state in RUNNING:
        state = RunState.RUNNING
    elif slurm_state == "COMPLETED":
        state, exit_value = RunState.SUCCEEDED, 0
    elif slurm_state in CANCELLED:
        state, failure, reason = RunState.CANCELLED, FailureClass.CANCELLED, cur["State"].lower()
    else:
        state = RunState.FAILED
        exit_value = code if code else (128 + sig if sig else code)
        failure, why = FAILED_STATES.get(slurm_state, (FailureClass.LOST, f"Slurm state {slurm_state}"))
        reason = f"{why} (Slurm {slurm_state}, exit {cur['ExitCode']})"
    if state in (RunState.SUCCEEDED, RunState.FAILED) and not nodes_complete(cur):
        # accounting has not recorded all its nodes yet: no verdict until it has
        state, exit_value, failure, reason = RunState.RUNNING, None, None, "ended; Slurm is still recording it"
    if earlier and state in (RunState.PENDING, RunState.RUNNING):
        reason = f"requeued {len(earlier)}x: {'; '.join(requeue_reasons)}"
    return SlurmObservation(state=state, nodes=nodes, exit_code=exit_value, failure=failure, reason=reason,
                            job_id=cur["JobIDRaw"], slurm_state=slurm_state, requeues=len(earlier),
                            requeue_reasons=requeue_reasons)


def with_output_evidence(obs: SlurmObservation) -> SlurmObservation:
    """A FAILED observation whose log tail (the program's own lines) shows it ran out of memory is
    `oom_gpu` or `oom_host` rather than `program_error`; anything else is returned unchanged."""
    if obs.state != RunState.FAILED or obs.failure != FailureClass.PROGRAM_ERROR or not obs.log_tail:
        return obs
    memory = memory_failure(obs.log_tail)
    if memory is None:
        return obs
    what = "GPU memory (CUDA out of memory)" if memory == FailureClass.OOM_GPU else "host memory (MemoryError)"
    return obs.model_copy(update={"failure": memory, "reason": f"out of {what}; {obs.reason}"})
