"""The pools-and-quotas file (`SHARDCTL_POOLS_FILE`, `shardctl export`): valid files load, bad ones name the field."""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest

from service.scheduling.config_file import PoolsFileError, load_pools_file, parse_pools_text
from service.scheduling.model import PreemptionPolicy

GOOD = """
pools:
  - {name: h100, backend: slurm, gpu: H100-SXM-80GB, gpus: 64, partition: gpu, preemption: lower_priority}
  - {name: l40s, backend: kubernetes, gpu: L40S-48GB, gpus: 32, namespace: ml, kueue: true}
teams:
  vision:
    weight: 2
    group: research
    flavors:
      H100-SXM-80GB: {nominal: 16, borrowing_limit: 8, lending_limit: 4}
  nlp: {flavors: {L40S-48GB: {nominal: 8}}}
"""


def test_a_valid_file_loads_pools_and_quotas(tmp_path: Path) -> None:
    path = tmp_path / "pools.yaml"
    path.write_text(GOOD)
    f = load_pools_file(path)
    assert [p.name for p in f.pools] == ["h100", "l40s"]
    assert f.pools[0].preemption is PreemptionPolicy.LOWER_PRIORITY
    q = f.teams["vision"].flavors["H100-SXM-80GB"]
    assert (q.nominal, q.borrowing_limit, q.lending_limit) == (16, 8, 4)
    assert f.teams["vision"].group == "research" and f.teams["nlp"].weight == 1.0


def test_an_empty_file_is_an_empty_declaration() -> None:
    f = parse_pools_text("")
    assert f.pools == [] and f.teams == {}


@pytest.mark.parametrize(("text", "needle"), [
    ("pools: [{name: a, backend: local, gpu: cpu, gpus: 0}]", "pools.0.gpus"),
    ("pools: [{name: a, backend: local, gpu: cpu, gpus: 2}, {name: a, backend: local, gpu: cpu, gpus: 2}]",
     "pools.1.name"),
    ("pools: [{name: a, backend: local, gpu: cpu, gpus: 2}]\nteams: {x: {flavors: {H100: {nominal: 1}}}}",
     "teams.x.flavors.H100: no pool has GPU kind 'H100'; use one of cpu"),
    ("pools: [{name: a, backend: local, gpu: cpu, gpus: 2}]\nteams: {Bad_Team: {}}", "teams.Bad_Team"),
    ("pools: [{name: a, backend: local, gpu: cpu, gpus: 2, colour: red}]", "pools.0.colour"),
])
def test_bad_input_names_the_field(text: str, needle: str) -> None:
    with pytest.raises(pydantic.ValidationError) as info:
        parse_pools_text(text)
    assert needle in str(info.value)


def test_a_missing_or_malformed_file_is_a_pools_file_error(tmp_path: Path) -> None:
    with pytest.raises(PoolsFileError, match="cannot read"):
        load_pools_file(tmp_path / "absent.yaml")
    with pytest.raises(PoolsFileError, match="expected a mapping"):
        parse_pools_text("- just\n- a list\n")
