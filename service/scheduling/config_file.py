"""The pools-and-quotas file: what `SHARDCTL_POOLS_FILE`, `shardctl export` and `shardctl simulate` read.

Format (YAML or JSON; JSON is YAML)::

    pools:
      - {name: h100, backend: slurm, gpu: H100-SXM-80GB, gpus: 64, partition: gpu}
      - {name: l40s, backend: kubernetes, gpu: L40S-48GB, gpus: 32, namespace: ml, kueue: true}
    teams:
      vision:
        weight: 2
        group: research
        flavors:
          H100-SXM-80GB: {nominal: 16, borrowing_limit: 8, lending_limit: 4}

`pools` is a list of `model.Pool`, `teams` maps a team name (a DNS label) to its `model.TeamQuota`.
Contract: pool names are unique; every flavor a team names is the GPU kind of some pool (a quota
for hardware no pool has is a typo, refused with the kinds that exist). Errors are
`PoolsFileError` (unreadable or not a mapping) or `pydantic.ValidationError` (a field, named by
its path: `teams.vision.flavors.H100-SXM-80GB.nominal`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from service.names import check_label
from service.scheduling.model import Pool, TeamQuota


class PoolsFileError(ValueError):
    """The file cannot be read or is not a `{pools: [...], teams: {...}}` mapping."""


class PoolsFile(BaseModel):
    """The whole declaration: every pool and every team's quota."""

    model_config = ConfigDict(extra="forbid")

    pools: list[Pool] = Field(default_factory=list, description="GPUs of one kind behind one backend each.")
    teams: dict[str, TeamQuota] = Field(default_factory=dict, description="Quota per team name.")

    @model_validator(mode="after")
    def _consistent(self) -> PoolsFile:
        seen: set[str] = set()
        for i, p in enumerate(self.pools):
            if p.name in seen:
                raise ValueError(f"pools.{i}.name: pool {p.name!r} is declared twice; give each pool its own name")
            seen.add(p.name)
        kinds = sorted({p.gpu for p in self.pools})
        for team, quota in self.teams.items():
            try:
                check_label(team)
            except ValueError as exc:
                raise ValueError(f"teams.{team}: {exc}") from None
            for flavor in quota.flavors:
                if flavor not in kinds:
                    raise ValueError(
                        f"teams.{team}.flavors.{flavor}: no pool has GPU kind {flavor!r};"
                        f" use one of {', '.join(kinds) or '(no pools declared)'} or add a pool of that kind")
        return self


def parse_pools_text(text: str, *, source: str = "<pools>") -> PoolsFile:
    """Parse YAML/JSON text into a validated `PoolsFile` (an empty document is an empty declaration)."""
    try:
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PoolsFileError(f"{source}: not valid YAML or JSON: {exc}") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise PoolsFileError(f"{source}: expected a mapping with `pools:` (a list) and `teams:` (a mapping)")
    return PoolsFile.model_validate(data)


def load_pools_file(path: str | Path) -> PoolsFile:
    """Read and validate the file at `path`; `PoolsFileError` names the path when it cannot be read."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PoolsFileError(f"{p}: cannot read the pools file: {exc}") from exc
    return parse_pools_text(text, source=str(p))


__all__ = ["PoolsFile", "PoolsFileError", "load_pools_file", "parse_pools_text"]
