"""How shardctl names a team's Kueue objects: one function per name, shared by `shardctl export kueue`
(`export_kueue`) and by the labels a Kueue-managed pool's workloads carry (`kueue_queue`), so a label
always names an object the export renders.

- LocalQueue: named as the team (`local_queue_name`), one in each namespace of the Kubernetes pools.
- WorkloadPriorityClass: one per priority band (`service.scheduling.bands`); a job of priority p gets
  the class of its band (`priority_class_name`), e.g. `shardctl-p50`.

Pure: no store, no backend.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from service.scheduling.bands import band_for, band_name

#: the label that names a workload's LocalQueue
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
#: the label that names a workload's WorkloadPriorityClass
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"


class KueueQueue(BaseModel):
    """Where Kueue queues a job of a Kueue-managed pool: its LocalQueue and WorkloadPriorityClass names.
    The Kubernetes backend labels the workload with both and creates it suspended."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    queue: str = Field(min_length=1, max_length=63, description="The LocalQueue (label queue-name).")
    priority_class: str = Field(min_length=1, max_length=253,
                                description="The WorkloadPriorityClass (label priority-class).")


def local_queue_name(team: str) -> str:
    """The name of `team`'s LocalQueue (in every namespace of the Kubernetes pools): the team's name."""
    return team


def priority_class_name(priority: int, bands: Sequence[int]) -> str:
    """The WorkloadPriorityClass of a job of `priority`: its band's name (`bands`: the band values, as
    `priority_bands` / `bands_of` give them, never empty)."""
    return band_name(band_for(priority, list(bands)))


def kueue_queue(team: str, priority: int, bands: Sequence[int]) -> KueueQueue:
    """The queue and priority class of a job of `team` at `priority`."""
    return KueueQueue(queue=local_queue_name(team), priority_class=priority_class_name(priority, bands))


__all__ = ["PRIORITY_CLASS_LABEL", "QUEUE_LABEL", "KueueQueue", "kueue_queue", "local_queue_name",
           "priority_class_name"]
