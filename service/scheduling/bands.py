"""Priority bands: the priorities the quota tree names, as Kueue WorkloadPriorityClasses and Slurm QOS.

The bands are 0 and every team's `max_priority`, sorted. A job of priority p belongs to the highest
band whose value is at most p (the lowest band when p is below all). Names: `shardctl-p<value>`
(`shardctl-m<value>` for a negative one; another prefix may replace `shardctl`), valid as a Kubernetes
name and a Slurm QOS name.
"""

from __future__ import annotations

from collections.abc import Iterable

from service.scheduling.config_file import PoolsFile
from service.scheduling.model import TeamQuota


def band_name(value: int, prefix: str = "shardctl") -> str:
    return f"{prefix}-p{value}" if value >= 0 else f"{prefix}-m{-value}"


def priority_bands(pf: PoolsFile) -> list[int]:
    """The band values of a pools file's teams, ascending."""
    return bands_of(pf.teams.values())


def bands_of(quotas: Iterable[TeamQuota]) -> list[int]:
    """The band values of these quotas (0 and each `max_priority`), ascending; never empty."""
    return sorted({0} | {q.max_priority for q in quotas})


def band_for(priority: int, bands: list[int]) -> int:
    """The band a job of `priority` belongs to."""
    below = [b for b in bands if b <= priority]
    return below[-1] if below else bands[0]


__all__ = ["band_for", "band_name", "bands_of", "priority_bands"]
