"""What the local machine has: the embedded default pool when no pool of the local backend is declared.

`SHARDCTL_LOCAL_GPUS=KIND:COUNT` says it outright (e.g. `H100-SXM-80GB:8`, `cpu:4`); otherwise
`nvidia-smi` is asked (the service never imports torch), and a machine without NVIDIA GPUs offers
`cpu` slots, one per core (at least 2, so that the bundled two-process demo fits a one-core machine).
A machine with GPUs offers them as pool `local` and its cores as pool `local-cpu`, so CPU jobs still
run there; a GPU spec never runs on CPU (its kind has no pool, and submit refuses it).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from functools import lru_cache

from service.backend_options import BackendKind
from service.planner.hardware import CATALOG
from service.scheduling.model import Pool

LOCAL = "local"
LOCAL_CPU = "local-cpu"
MIN_CPU_SLOTS = 2
NVIDIA_SMI_TIMEOUT_S = 10.0


def local_pools(override: str | None) -> list[Pool]:
    """The embedded default pools of the local backend (`override` is SHARDCTL_LOCAL_GPUS)."""
    if override:
        kind, _, count = override.rpartition(":")
        return [Pool(name=LOCAL, backend=BackendKind.LOCAL, gpu=kind, gpus=max(1, min(int(count), 1_000_000)))]
    return list(_detected())


@lru_cache(maxsize=1)
def _detected() -> tuple[Pool, ...]:
    cores = max(MIN_CPU_SLOTS, os.cpu_count() or 1)
    gpus = nvidia_gpus()
    if not gpus:
        return (Pool(name=LOCAL, backend=BackendKind.LOCAL, gpu="cpu", gpus=cores),)
    kind = max(set(gpus), key=gpus.count)  # a mixed machine offers its most common kind
    devices = [str(i) for i, g in enumerate(gpus) if g == kind]
    return (Pool(name=LOCAL, backend=BackendKind.LOCAL, gpu=kind, gpus=len(devices), devices=devices),
            Pool(name=LOCAL_CPU, backend=BackendKind.LOCAL, gpu="cpu", gpus=cores))


def nvidia_gpus() -> list[str]:
    """The catalog kind of each GPU `nvidia-smi` lists, in device order; [] without nvidia-smi or GPUs."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        done = subprocess.run([exe, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return []
    if done.returncode != 0:
        return []
    kinds = []
    for line in done.stdout.splitlines():
        name, _, memory = line.rpartition(",")
        if name.strip():
            kinds.append(catalog_kind(name.strip(), _mib(memory)))
    return kinds


_POWER_VARIANT = re.compile(r"-\d+W$")


def _mib(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.isdigit() else None


def catalog_kind(name: str, memory_mib: int | None = None) -> str:
    """The GPU catalog's name for what nvidia-smi calls `name` (e.g. "NVIDIA H100 80GB HBM3" ->
    H100-SXM-80GB): the catalog entry of the same family (H100, A100, ...), PCIe when the name says
    so, else SXM, the closest in memory. Entries for a power-limited variant (a name ending in a
    wattage, e.g. H100-SXM-96GB-500W) are never guessed: nvidia-smi's name does not tell the power
    limit, so an operator names such a kind in the pool configuration. A GPU the catalog lacks keeps
    nvidia-smi's name, in the catalog's spelling (e.g. RTX-4090), so that specs name it as an inline GPU."""
    words = re.findall(r"[A-Za-z0-9]+", name.upper())
    family = [k for k in CATALOG if k != "cpu" and k.split("-")[0].upper() in words and not _POWER_VARIANT.search(k)]
    if not family:
        plain = "-".join(w for w in re.findall(r"[A-Za-z0-9]+", name) if w.upper() not in ("NVIDIA", "GEFORCE"))
        return plain[:64] or "gpu"
    pcie = "PCIE" in words
    family = [k for k in family if ("PCIe" in k) == pcie] or family
    if memory_mib is None:
        return family[0]
    gib = memory_mib / 1024
    return min(family, key=lambda k: abs(CATALOG[k].memory_gib - gib))


__all__ = ["LOCAL", "LOCAL_CPU", "catalog_kind", "local_pools", "nvidia_gpus"]
