"""Why an attempt ended badly: the failure classes and the one retry policy that follows from them.

Pure (no store, no backend): the store keeps the class on each attempt (`service.store.vocab`
re-exports it), the API and the CLI show it, and the backends, which may not import the store,
classify what they observe with it. `docs/failures.md` lists each class's evidence per backend.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["RETRIED", "FailureClass"]


class FailureClass(StrEnum):
    """The cause of a finished attempt that did not succeed, as far as the backend's evidence tells.

    Stored as its value (VARCHAR(32)); `lost` only when nothing else is known."""

    PROGRAM_ERROR = "program_error"  # the program exited non-zero by itself (its own exit code)
    OOM_GPU = "oom_gpu"  # the program ran out of GPU memory (CUDA out of memory)
    OOM_HOST = "oom_host"  # out of host memory: MemoryError, the OOM killer, a container memory limit
    LAUNCH_ERROR = "launch_error"  # the backend refused or could not start it (E2BIG, image pull...)
    NODE_FAILURE = "node_failure"  # a node died, was drained or evicted the pods
    PREEMPTED = "preempted"  # a higher-priority job took the resources
    CAPACITY = "capacity"  # no room now (unschedulable); transient by nature
    TIMEOUT = "timeout"  # the attempt reached its time limit
    CANCELLED = "cancelled"  # a user or an operator stopped it
    LOST = "lost"  # the backend lost track of it and nothing else is known

    @property
    def retried(self) -> bool:
        """Whether the dispatcher tries the job again (up to `max_attempts`) after this class."""
        return self in RETRIED


#: The classes a new attempt can fix, because the cause lies outside the program and its spec:
#: a node, a preemption, a full cluster, or a run the backend lost. Not retried:
#:
#: - `program_error`, `oom_gpu`, `oom_host`, `launch_error`: the same program with the same spec and
#:   the same resources fails the same way; a retry only spends the resources again and hides the
#:   cause behind "attempt 3 of 3".
#: - `timeout`: a run stopped at its time limit is stopped there again from the same start, since the
#:   limit is the spec's. A run that checkpoints resumes through preemption (Slurm requeues it
#:   before the limit, `preempted`), not through a second full allotment; so a time limit is final.
#: - `cancelled`: someone asked for it to stop.
RETRIED: frozenset[FailureClass] = frozenset({FailureClass.NODE_FAILURE, FailureClass.PREEMPTED,
                                              FailureClass.CAPACITY, FailureClass.LOST})
