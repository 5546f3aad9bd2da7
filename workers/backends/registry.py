"""Which backends a dispatcher can use, built from the settings."""

from __future__ import annotations

import contextlib
import os
import shutil

from service.settings import Settings
from workers.backends.base import Backend
from workers.backends.local import LocalBackend
from workers.backends.local_devices import LocalDevices


def make_backends(settings: Settings) -> dict[str, Backend]:
    """`local` always (its devices from `settings.local_devices`, else detected; run as
    `settings.local_run_as` when set: `LocalBackend` raises `ValueError` saying what is wrong with it);
    `slurm` when `sbatch` is
    on PATH; `kubernetes` when a kubeconfig (settings or
    $KUBECONFIG) or an in-cluster service account is there."""
    devices = LocalDevices.parse(settings.local_devices) if settings.local_devices else LocalDevices.detect()
    backends: dict[str, Backend] = {"local": LocalBackend(settings.data_dir / "local", devices,
                                                          run_as=settings.local_run_as)}
    if shutil.which("sbatch"):
        from workers.backends.slurm import SlurmBackend

        backends["slurm"] = SlurmBackend(folder=settings.data_dir / "slurm")
    if settings.kubeconfig is not None or os.environ.get("KUBECONFIG") or os.environ.get("KUBERNETES_SERVICE_HOST"):
        from workers.backends.base import BackendUnavailable
        from workers.backends.kubernetes import KubernetesBackend

        with contextlib.suppress(BackendUnavailable):
            backends["kubernetes"] = KubernetesBackend.from_environment(
                settings.kubeconfig, namespace=settings.kubernetes_namespace,
                namespaces=settings.kubernetes_namespaces, default_image=settings.kubernetes_default_image,
                queue_for_team=settings.kubernetes_queues)
    return backends
