"""How sacct's history and squeue's current record of one job combine (`accounting.merge`), on the
record shapes this cluster prints: a requeued job is never read as ended (it would be submitted a
second time), and one cancelled while queued again is read as cancelled (sacct may never record it)."""

from __future__ import annotations

from workers.backends.base import RunState
from workers.backends.slurm.accounting import merge
from workers.backends.slurm.states import observe


def record(state: str, *, nodes: str = "node[1-2]", exit_code: str = "0:0") -> dict[str, str]:
    return {"JobIDRaw": "240", "JobName": "shardctl-7-1", "State": state, "ExitCode": exit_code,
            "NodeList": nodes, "Reason": "None", "WorkDir": "/srv/shardctl/7", "NNodes": "2", "StartTime": "N/A"}


def test_a_job_cancelled_while_queued_again_after_a_requeue_reads_as_cancelled() -> None:
    sacct = [record("REQUEUED", exit_code="0:15")]  # the first run, requeued; no record of the cancel
    merged = merge(sacct, record("CANCELLED", nodes=""))
    assert merged is not None
    seen = observe(merged)
    assert seen.state == RunState.CANCELLED
    assert seen.requeues == 1  # the requeued run is still counted


def test_a_requeued_job_queued_again_reads_as_pending_not_ended() -> None:
    merged = merge([record("PREEMPTED", exit_code="0:15")], record("PENDING", nodes=""))
    assert merged is not None and observe(merged).state == RunState.PENDING
