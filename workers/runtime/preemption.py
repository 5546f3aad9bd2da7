"""Notice of preemption inside the job: a signal asks the ranks to checkpoint and stop.

Backends give notice with SIGTERM before they kill a job (the local backend's supervisor, torchrun
passing it on, a Kubernetes pod deletion with its grace period, Slurm before a requeue or at
preemption); SIGUSR1 is accepted too, for a Slurm `--signal=USR1@<s>` a site adds. The handler only
records the notice. The trainer asks `agree` after every step: one all-reduce (MAX) of the flag, so
every rank stops after the same step even when the signal reached them between two different
checks. It then saves a checkpoint and exits with `service.jobenv.PREEMPTED_EXIT_CODE`, which the
backends report as `preempted`; the next attempt resumes from that checkpoint.
"""

from __future__ import annotations

import signal
from types import FrameType

import torch
import torch.distributed as dist

#: The signals that mean "checkpoint and stop".
NOTICE_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class Notice:
    """Whether this rank has been told to stop (set from a signal handler; read by the training loop)."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def install(self) -> Notice:
        """Catch the notice signals in this (the main) thread from now on."""
        for sig in NOTICE_SIGNALS:
            signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.signum is None:
            self.signum = signum

    @property
    def given(self) -> bool:
        return self.signum is not None

    def agree(self, device: torch.device) -> bool:
        """True on every rank when any rank has notice. Collective: every rank calls it after the same step."""
        flag = torch.tensor([1 if self.given else 0], dtype=torch.int32, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())
