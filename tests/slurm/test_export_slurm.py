"""`shardctl export slurm` applied to the real Slurm cluster (deploy/slurm.sh) and read back.

The cluster keeps accounting in slurmdbd, so accounts, QOS, fair-share shares and GrpTRES limits
are real associations. Its pools count CPU slots, so the cap reads back as `cpu=N`; `gres/gpu` is
checked only where the cluster's AccountingStorageTRES knows it (deploy/slurm.sh's does not).
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Iterator

import pytest

from service.scheduling.config_file import PoolsFile, parse_pools_text
from service.scheduling.export_slurm import render_slurm, render_slurm_cleanup
from tests.slurm.conftest import slurm_partition

PREFIX = "zzexp"  # QOS and account names no other test uses
POOLS = f"""
pools:
  - {{name: cpu, backend: slurm, gpu: cpu, gpus: 8, partition: debug, preemption: lower_priority}}
teams:
  {PREFIX}-vision: {{weight: 2, max_priority: 50, group: {PREFIX}-research,
                   flavors: {{cpu: {{nominal: 4, borrowing_limit: 2}}}}}}
  {PREFIX}-nlp: {{weight: 0.5, group: {PREFIX}-research, flavors: {{cpu: {{nominal: 2}}}}}}
  {PREFIX}-ops: {{weight: 1, max_priority: -5, flavors: {{cpu: {{nominal: 1, borrowing_limit: 0}}}}}}
"""


def sh(line: str) -> str:
    done = subprocess.run(shlex.split(line), capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, f"{line}: {done.stderr or done.stdout}"
    return done.stdout


@pytest.fixture
def applied() -> Iterator[PoolsFile]:
    slurm_partition()
    pf = parse_pools_text(POOLS)
    cleanup = render_slurm_cleanup(pf, qos_prefix=PREFIX)
    for line in cleanup:  # leftovers of an interrupted run
        subprocess.run(shlex.split(line), capture_output=True, timeout=60, check=False)
    try:
        for line in render_slurm(pf, qos_prefix=PREFIX):
            sh(line)
        yield pf
    finally:
        for line in cleanup:
            subprocess.run(shlex.split(line), capture_output=True, timeout=60, check=False)


def test_accounts_fairshare_caps_and_qos_read_back(applied: PoolsFile) -> None:
    accounts = ",".join([f"{PREFIX}-vision", f"{PREFIX}-nlp", f"{PREFIX}-ops", f"{PREFIX}-research"])
    out = sh(f"sacctmgr -n -P show assoc where account={accounts} format=account,parentname,fairshare,grptres,qos,"
             "defaultqos")
    rows = {r.split("|")[0]: r.split("|") for r in out.splitlines() if r.strip()}
    vision, nlp, ops = rows[f"{PREFIX}-vision"], rows[f"{PREFIX}-nlp"], rows[f"{PREFIX}-ops"]
    assert vision[1:4] == [f"{PREFIX}-research", "200", "cpu=6"]  # weight 2 -> 200; nominal 4 + borrow 2
    assert nlp[1:4] == [f"{PREFIX}-research", "50", "cpu=8"]  # no borrowing limit: the pool's 8
    assert ops[1:4] == ["root", "100", "cpu=1"]
    assert set(vision[4].split(",")) == {f"{PREFIX}-m5", f"{PREFIX}-p0", f"{PREFIX}-p50"}  # up to max_priority 50
    assert vision[5] == f"{PREFIX}-p0"
    assert (ops[4], ops[5]) == (f"{PREFIX}-m5", f"{PREFIX}-m5")  # max_priority -5: the lowest band only
    qos = {r.split("|")[0]: r.split("|") for r in sh("sacctmgr -n -P show qos format=name,priority,preempt,"
                                                      "preemptmode").splitlines() if r.startswith(PREFIX)}
    assert qos[f"{PREFIX}-m5"][1] == "0" and qos[f"{PREFIX}-p100"][1] == "105"
    assert set(qos[f"{PREFIX}-p50"][2].split(",")) == {f"{PREFIX}-m5", f"{PREFIX}-p0"}
    assert qos[f"{PREFIX}-p50"][3] == "requeue"
    shares = sh(f"sshare -n -P -a -A {PREFIX}-vision,{PREFIX}-nlp -o Account,RawShares")
    got = {line.split("|")[0].strip(): line.split("|")[1] for line in shares.splitlines() if line.strip()}
    assert got[f"{PREFIX}-vision"] == "200" and got[f"{PREFIX}-nlp"] == "50"


def test_gpu_caps_apply_where_the_cluster_tracks_gres_gpu() -> None:
    slurm_partition()
    assert "gres/gpu" in sh("sacctmgr -n -P show tres format=type,name").replace("|", "/"), (
        "the cluster does not track gres/gpu: deploy/slurm.sh sets GresTypes=gpu and AccountingStorageTRES=gres/gpu;"
        " run it again to reconfigure")
    pf = parse_pools_text(f"""
pools: [{{name: h100, backend: slurm, gpu: H100-SXM-80GB, gpus: 16, partition: debug}}]
teams: {{{PREFIX}-gpu: {{flavors: {{H100-SXM-80GB: {{nominal: 4, borrowing_limit: 2}}}}}}}}
""")
    try:
        for line in render_slurm(pf, qos_prefix=PREFIX):
            sh(line)
        assert "gres/gpu=6" in sh(f"sacctmgr -n -P show assoc where account={PREFIX}-gpu format=grptres")
    finally:
        for line in render_slurm_cleanup(pf, qos_prefix=PREFIX):
            subprocess.run(shlex.split(line), capture_output=True, timeout=60, check=False)


def test_cleanup_removes_everything(applied: PoolsFile) -> None:
    for line in render_slurm_cleanup(applied, qos_prefix=PREFIX):
        sh(line)
    assert sh(f"sacctmgr -n -P show assoc where account={PREFIX}-vision format=account").strip() == ""
    assert PREFIX not in sh("sacctmgr -n -P show qos format=name")
