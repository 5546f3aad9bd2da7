"""Why an attempt ended badly: the failure classes and the one retry policy that follows from them.

Pure (no store, no backend): the store keeps the class on each attempt (`service.store.vocab`
re-exports it), the API and the CLI show it, and the backends, which may not import the store,
classify what they observe with it. `docs/failures.md` lists each class's evidence per backend.
"""

from __future__ import annotations

import re
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["OUT_OF_MEMORY", "RETRIED", "FailureClass", "MeasuredOom", "measured_oom", "oom_line"]


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


#: The classes an out-of-memory re-plan answers (`TrainingSpec.recovery`, `service.planner.replan`).
OUT_OF_MEMORY: frozenset[FailureClass] = frozenset({FailureClass.OOM_GPU, FailureClass.OOM_HOST})

#: The one line the runtime prints (last, on stderr) when a rank runs out of memory, read back from any
#: backend's log tail by `measured_oom`. Bytes are what the rank's allocator held when the failing
#: allocation was asked for, plus that allocation (`peak`), and what it could have held (`limit`: the
#: device's memory, or the runtime's per-process budget; `none` when unknown).
_OOM_LINE = re.compile(r"shardctl: out of memory \((oom_gpu|oom_host)\) on rank (\d+): peak (\d+) bytes,"
                       r" limit (\d+|none) bytes")


class MeasuredOom(BaseModel):
    """What a rank measured when it ran out of memory (see `oom_line`)."""

    model_config = ConfigDict(frozen=True)

    failure: FailureClass
    rank: int
    peak_bytes: int = Field(ge=0, description="Bytes held when the failing allocation was asked for, plus it.")
    limit_bytes: int | None = Field(None, ge=0, description="Bytes the rank could hold: device memory or budget.")
    source: str = ""


def oom_line(oom: MeasuredOom) -> str:
    """The runtime's out-of-memory line, e.g. `shardctl: out of memory (oom_gpu) on rank 1: peak 81234 bytes,
    limit 80000 bytes (cpu memory budget)`; `measured_oom` reads it back."""
    limit = "none" if oom.limit_bytes is None else str(oom.limit_bytes)
    line = (f"shardctl: out of memory ({oom.failure.value}) on rank {oom.rank}: peak {oom.peak_bytes} bytes,"
            f" limit {limit} bytes")
    return f"{line} ({oom.source})" if oom.source else line


def measured_oom(text: str) -> MeasuredOom | None:
    """The largest peak any rank reported in `text` (a log tail) with `oom_line`, or None when no rank did.
    Among ranks, the one with the largest peak wins; its limit is kept with it."""
    found = [MeasuredOom(failure=FailureClass(m.group(1)), rank=int(m.group(2)), peak_bytes=int(m.group(3)),
                         limit_bytes=None if m.group(4) == "none" else int(m.group(4)))
             for m in _OOM_LINE.finditer(text)]
    return max(found, key=lambda o: (o.peak_bytes, -o.rank)) if found else None
