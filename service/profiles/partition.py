"""The exclusive split of a window into compute / comm / memory combinations and idle."""

from __future__ import annotations

from service.profiles.intervals import Union, intersect, measure, subtract, union
from service.profiles.models import IdleBreakdown, Partition
from service.profiles.stats import pct
from service.profiles.timeline import Timeline, next_gpu_launch

KERNEL_WAIT_US = 30.0


def partition_window(tl: Timeline, start: float, end: float) -> tuple[Partition, Union]:
    """The partition of [start, end) and the idle intervals in it."""
    c, m, y = tl.compute.clip(start, end), tl.comm.clip(start, end), tl.memory.clip(start, end)
    cm, cy, my = intersect(c, m), intersect(c, y), intersect(m, y)
    cmy = measure(intersect(cm, y))
    busy = union(c + m + y)
    idle = subtract([(start, end)], busy) if end > start else []
    fields = {
        "compute_only_us": measure(c) - measure(cm) - measure(cy) + cmy,
        "comm_only_us": measure(m) - measure(cm) - measure(my) + cmy,
        "memory_only_us": measure(y) - measure(cy) - measure(my) + cmy,
        "compute_comm_us": measure(cm) - cmy,
        "compute_memory_us": measure(cy) - cmy,
        "comm_memory_us": measure(my) - cmy,
        "compute_comm_memory_us": cmy,
        "idle_us": measure(idle),
    }
    window = max(end - start, 0.0)
    fields = {k: round(max(v, 0.0), 3) for k, v in fields.items()}
    return Partition(
        window_us=round(window, 3), pct={k[:-3]: pct(v, window) for k, v in fields.items()}, **fields
    ), idle


def idle_breakdown(tl: Timeline, idle: Union) -> IdleBreakdown:
    """Split idle intervals: data loader, host sync, then (GPU) host-wait / kernel-wait / other."""
    loader = intersect(idle, tl.data_loader)
    rest = subtract(idle, tl.data_loader)
    sync = intersect(rest, tl.host_sync)
    rest = subtract(rest, tl.host_sync)
    host = kernel = other = 0.0
    for a, b in rest:
        launch = next_gpu_launch(tl, b) if tl.basis == "gpu_kernels" else None
        if launch is not None and launch > a:
            host += b - a
        elif launch is not None and b - a < KERNEL_WAIT_US:
            kernel += b - a
        else:
            other += b - a
    return IdleBreakdown(
        data_loader_us=round(measure(loader), 3),
        sync_wait_us=round(measure(sync), 3),
        host_wait_us=round(host, 3),
        kernel_wait_us=round(kernel, 3),
        other_us=round(other, 3),
    )


def add_partitions(parts: list[Partition]) -> Partition:
    keys = [k for k in Partition.model_fields if k.endswith("_us")]
    sums = {k: round(sum(getattr(p, k) for p in parts), 3) for k in keys}
    window = sums.pop("window_us")
    return Partition(window_us=window, pct={k[:-3]: pct(v, window) for k, v in sums.items()}, **sums)


def add_idle(items: list[IdleBreakdown]) -> IdleBreakdown:
    return IdleBreakdown(
        **{k: round(sum(getattr(i, k) for i in items), 3) for k in IdleBreakdown.model_fields}
    )


def move_to_idle(p: Partition, waiting_us: float) -> Partition:
    """``p`` with ``waiting_us`` of ``comm_only_us`` moved to ``idle_us`` (a rank waiting for a peer)."""
    waiting = round(min(max(waiting_us, 0.0), p.comm_only_us), 3)
    fields = {k: getattr(p, k) for k in Partition.model_fields if k.endswith("_us")}
    fields["comm_only_us"] = round(fields["comm_only_us"] - waiting, 3)
    fields["idle_us"] = round(fields["idle_us"] + waiting, 3)
    window = fields.pop("window_us")
    return Partition(window_us=window, pct={k[:-3]: pct(v, window) for k, v in fields.items()}, **fields)
