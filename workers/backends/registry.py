"""Which backends a dispatcher can use, built from the settings."""

from __future__ import annotations

import shutil

from service.settings import Settings
from workers.backends.base import Backend
from workers.backends.local import LocalBackend


def make_backends(settings: Settings) -> dict[str, Backend]:
    """`local` always; `slurm` when `sbatch` is on PATH; `kubernetes` when a kubeconfig is set."""
    backends: dict[str, Backend] = {"local": LocalBackend(settings.data_dir / "local")}
    if shutil.which("sbatch"):
        try:
            from workers.backends.slurm import SlurmBackend  # type: ignore[import-not-found,unused-ignore]

            backends["slurm"] = SlurmBackend(folder=settings.data_dir / "slurm")
        except ImportError:
            pass
    return backends
