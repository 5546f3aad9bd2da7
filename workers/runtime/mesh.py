"""Process group and device mesh for a layout.

Ranks are ordered as the planner orders them: pp (outermost), dp, cp, tp (innermost). The
data-parallel dimension is one mesh dimension `dp` for ddp/zero1/zero2/zero3/fsdp, and two,
`dp_replicate` x `dp_shard`, for hsdp. Only dimensions of size > 1 are built (each mesh
dimension costs one process group per slice); `Mesh.size(name)` is 1 for the others.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from service.planner import Layout
from service.planner.runnable import runtime_gaps
from workers.runtime.errors import UnsupportedLayout, WorldMismatch


def pick_device(wanted: str) -> torch.device:
    """`cuda:<LOCAL_RANK>` when asked for (or `auto` and CUDA is available), else `cpu`."""
    if wanted == "cuda" or (wanted == "auto" and torch.cuda.is_available()):
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def init_distributed(device: torch.device, timeout_s: float) -> None:
    """Initialise the default process group (NCCL on CUDA, gloo on CPU) from torchrun's env.

    `timeout_s` bounds rendezvous and every collective: a dead peer surfaces as an exception
    after at most that long instead of a hang. Without RANK/WORLD_SIZE in the environment a
    single-process group is created on a private port-free file store.
    """
    if dist.is_initialized():
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    timeout = timedelta(seconds=timeout_s)
    if "RANK" not in os.environ:
        import tempfile

        path = tempfile.mktemp(prefix="shardctl-pg-")
        dist.init_process_group(backend, init_method=f"file://{path}", rank=0, world_size=1, timeout=timeout)
        return
    kwargs: dict[str, object] = {}
    if device.type == "cuda":
        kwargs["device_id"] = device
    dist.init_process_group(backend, timeout=timeout, **kwargs)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Mesh:
    """The device mesh of a layout and this rank's coordinates in it."""

    mesh: DeviceMesh | None
    sizes: dict[str, int]

    def size(self, name: str) -> int:
        return self.sizes.get(name, 1)

    def has(self, name: str) -> bool:
        return self.size(name) > 1

    def sub(self, *names: str) -> DeviceMesh:
        """The sub-mesh over `names` (each must be a built dimension; see `sizes`)."""
        assert self.mesh is not None
        return self.mesh[names[0]] if len(names) == 1 else self.mesh[names]

    def coord(self, name: str) -> int:
        """This rank's index along `name` (0 when the dimension is trivial)."""
        if not self.has(name):
            return 0
        assert self.mesh is not None
        return int(self.mesh.get_local_rank(name))

    def group(self, name: str) -> dist.ProcessGroup | None:
        return self.sub(name).get_group() if self.has(name) else None

    @property
    def dp_rank(self) -> int:
        """Index of this rank's data-parallel replica slot, in [0, dp)."""
        if self.has("dp"):
            return self.coord("dp")
        return self.coord("dp_replicate") * self.size("dp_shard") + self.coord("dp_shard")


def dims_for(layout: Layout) -> list[tuple[str, int]]:
    """(name, size) of every mesh dimension, outermost first, trivial ones included."""
    if layout.sharding == "hsdp":
        if layout.dp % layout.dp_shard:
            raise UnsupportedLayout("dp_shard", f"dp_shard={layout.dp_shard} must divide dp={layout.dp}")
        dp_dims = [("dp_replicate", layout.dp // layout.dp_shard), ("dp_shard", layout.dp_shard)]
    else:
        dp_dims = [("dp", layout.dp)]
    return [("pp", layout.pp), *dp_dims, ("cp", layout.cp), ("tp", layout.tp)]


def build_mesh(layout: Layout, device: torch.device) -> Mesh:
    """Check the world against the plan and build the mesh of its non-trivial dimensions."""
    world = dist.get_world_size()
    if world != layout.world_size:
        raise WorldMismatch(f"the plan needs dp*tp*pp*cp = {layout.dp}*{layout.tp}*{layout.pp}*{layout.cp}"
                            f" = {layout.world_size} processes, but {world} were launched")
    for problem in runtime_gaps(layout, precision="fp32"):
        if problem.field == "cp":  # a mesh cannot be built without it (the rest: `check_supported`)
            raise UnsupportedLayout(problem.field, problem.message)
    dims = dims_for(layout)
    # HSDP needs both of its dimensions in the mesh, even a trivial one.
    real = [(n, s) for n, s in dims if s > 1 or n in ("dp_replicate", "dp_shard")]
    sizes = dict(real)
    if not real:
        return Mesh(mesh=None, sizes={})
    mesh = init_device_mesh(device.type, tuple(s for _, s in real), mesh_dim_names=tuple(n for n, _ in real))
    return Mesh(mesh=mesh, sizes=sizes)
