"""`shardctl export slurm`: the quota tree as `sacctmgr` commands (one per line, `sacctmgr -i` ready).

Mapping (docs/scheduling.md):
- a group is an account under `root` (`Organization=<group>`); a team is an account under its group
  (or under `root`), with `Fairshare` = the team's weight x `FAIRSHARE_SCALE`, rounded (Slurm takes
  integers; weight 0 becomes 0);
- `GrpTRES`: Slurm has no borrowing, so the cap is what the team may ever hold: per kind of the
  Slurm pools, nominal + borrowing limit (the kind's capacity in Slurm pools when the limit is unset),
  summed over GPU kinds as `gres/gpu=N` (`cpu=N` for a `cpu` pool, whose slots are CPUs); a team with
  no quota on any Slurm kind gets 0;
- one QOS per priority band (`bands`), `Priority` = the band's value shifted so the lowest band is 0
  (QOS priorities are unsigned); when a Slurm pool preempts by priority (`lower_priority`), each QOS
  may preempt the bands below it (`PreemptMode=requeue`); a team's association may use the bands up
  to its `max_priority`, band 0 (or the lowest) by default.
Users still have to be added to the team accounts (`sacctmgr add user NAME account=TEAM`).
"""

from __future__ import annotations

import shlex

from service.scheduling.bands import band_for, band_name, priority_bands
from service.scheduling.config_file import PoolsFile
from service.scheduling.model import PreemptionPolicy

FAIRSHARE_SCALE = 100


def team_cap(pf: PoolsFile, team: str) -> dict[str, int]:
    """TRES name -> the most the team may ever hold on the Slurm pools."""
    pools = [p for p in pf.pools if p.backend.value == "slurm"]
    capacity: dict[str, int] = {}
    for p in pools:
        capacity[p.gpu] = capacity.get(p.gpu, 0) + p.gpus
    caps: dict[str, int] = {}
    q = pf.teams[team]
    for kind, cap in sorted(capacity.items()):
        tres = "cpu" if kind == "cpu" else "gres/gpu"
        fq = q.flavors.get(kind)
        most = 0 if fq is None else min(cap, fq.nominal + (cap if fq.borrowing_limit is None else fq.borrowing_limit))
        caps[tres] = caps.get(tres, 0) + most
    return caps


def render_slurm(pf: PoolsFile, *, cluster: str | None = None, qos_prefix: str = "shardctl") -> list[str]:
    """The commands, in apply order: QOS, group accounts, team accounts. Raises ValueError when no pool
    has backend slurm."""
    if not any(p.backend.value == "slurm" for p in pf.pools):
        raise ValueError("pools: no pool has backend slurm; the Slurm export covers Slurm pools only")
    where = f" cluster={shlex.quote(cluster)}" if cluster else ""
    bands = priority_bands(pf)
    lowest = bands[0]
    preempt = any(p.backend.value == "slurm" and p.preemption == PreemptionPolicy.LOWER_PRIORITY for p in pf.pools)
    lines: list[str] = []
    for i, value in enumerate(bands):
        line = f"sacctmgr -i add qos {band_name(value, qos_prefix)} Priority={value - lowest}"
        if preempt and i > 0:
            line += f" Preempt={','.join(band_name(b, qos_prefix) for b in bands[:i])} PreemptMode=requeue"
        lines.append(line)
    for group in sorted({q.group for q in pf.teams.values() if q.group}):
        lines.append(f"sacctmgr -i add account {group} parent=root Organization={group}"
                     f" Description={shlex.quote('shardctl group ' + group)}{where}")
    for team in sorted(pf.teams):
        q = pf.teams[team]
        caps = team_cap(pf, team)
        tres = ",".join(f"{k}={v}" for k, v in sorted(caps.items()))
        allowed = [b for b in bands if b <= q.max_priority] or [lowest]
        default = band_name(band_for(0, allowed), qos_prefix)
        line = (f"sacctmgr -i add account {team} parent={q.group or 'root'}"
                f" Organization={q.group or team} Description={shlex.quote('shardctl team ' + team)}"
                f" Fairshare={round(q.weight * FAIRSHARE_SCALE)}")
        if tres:
            line += f" GrpTRES={tres}"
        line += f" QOS={','.join(band_name(b, qos_prefix) for b in allowed)} DefaultQOS={default}{where}"
        lines.append(line)
    return lines


def render_slurm_cleanup(pf: PoolsFile, *, qos_prefix: str = "shardctl") -> list[str]:
    """The commands that remove what `render_slurm` adds (teams, then groups, then QOS)."""
    teams = sorted(pf.teams)
    groups = sorted({q.group for q in pf.teams.values() if q.group})
    lines = []
    if teams:
        lines.append(f"sacctmgr -i delete account {','.join(teams)}")
    if groups:
        lines.append(f"sacctmgr -i delete account {','.join(groups)}")
    lines.append(f"sacctmgr -i delete qos {','.join(band_name(b, qos_prefix) for b in priority_bands(pf))}")
    return lines


__all__ = ["FAIRSHARE_SCALE", "render_slurm", "render_slurm_cleanup", "team_cap"]
