"""Name-based classification of GPU events and CPU ops.

Two tables: ``hta_kernel_type`` is HTA 0.5.0's exact rule (anchored ``re.match``; used only by
``hta_compat``); ``classify_gpu_event`` is ours ("own-v1"): it also recognises ``ncclDevKernel_*``,
lowercase and RCCL/HCCL names and kernels that carry ``Collective name``, treats memcpy/memset by
category, and does not count synchronisation events as busy.
"""

from __future__ import annotations

import re
from enum import StrEnum


class EventClass(StrEnum):
    compute = "compute"
    comm = "comm"
    memory = "memory"
    other = "other"


# HTA 0.5.0, hta/utils/utils.py
_HTA_COMM = re.compile(r"^nccl.*Kernel")
_HTA_MEMORY = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
_HTA_NOT_COMPUTE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")


def hta_kernel_type(name: str) -> str:
    """HTA 0.5.0's ``get_kernel_type``: COMMUNICATION, MEMORY, COMPUTATION or OTHER."""
    if _HTA_COMM.match(name):
        return "COMMUNICATION"
    if _HTA_MEMORY.match(name):
        return "MEMORY"
    if not _HTA_NOT_COMPUTE.match(name):
        return "COMPUTATION"
    return "OTHER"


GPU_EVENT_CATS = frozenset({"kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset", "cuda_sync"})
_MEM_NAME = re.compile(r"^(hip)?Mem(cpy|set)|^dma")
_COMM_NAME = re.compile(r"nccl|^rccl|^hccl|^hip.*(AllReduce|AllGather|ReduceScatter|Broadcast)", re.I)
_OTHER_NAME = re.compile(r"Sync|^Stream Wait Event|^cuda.*LaunchKernel|^runFunction")


def classify_gpu_event(name: str, cat: str, has_collective_args: bool) -> EventClass:
    """Own-v1 class of an event on a GPU stream."""
    if cat in ("gpu_memcpy", "gpu_memset", "Memcpy", "Memset") or _MEM_NAME.match(name):
        return EventClass.memory
    if cat == "cuda_sync" or _OTHER_NAME.search(name):
        return EventClass.other
    if has_collective_args or _COMM_NAME.search(name):
        return EventClass.comm
    return EventClass.compute


COMM_BACKEND_OP = re.compile(r"^(gloo|nccl|mpi|ucc|xccl|hccl):")
COMM_ENQUEUE_OP = re.compile(r"^(c10d::|record_param_comms$|c10d_functional::|_c10d_functional::)")
CPU_COPY_OP = re.compile(r"^aten::(copy_|_to_copy|contiguous|clone|cat|index_select|_local_scalar_dense)$")
DATA_LOADER = re.compile(r"^enumerate\((DataLoader|DataPipe)\)#")
PROFILER_STEP = re.compile(r"^ProfilerStep\s*#\s*(\d+)$")
HOST_SYNC_OP = re.compile(r"^(cuda(Stream|Device|Event)Synchronize|aten::item|aten::_local_scalar_dense)$")
LAUNCH_RUNTIME = frozenset(
    {
        "cudaLaunchKernel",
        "cudaLaunchKernelExC",
        "cudaMemcpyAsync",
        "cudaMemsetAsync",
        "hipLaunchKernel",
        "hipExtLaunchKernel",
        "hipMemcpyAsync",
        "hipMemsetAsync",
    }
)

# Each label with what marks it, tried in this order on the lowercased name: substrings anywhere,
# prefixes, whole names, a pattern. As the case-insensitive patterns they replace
# (`tests/profiles/test_classify.py` keeps those), at a tenth of the time: a real trace has hundreds of
# kernel names, each some 150 characters long.
_SUBCATEGORIES: tuple[tuple[str, tuple[str, ...], tuple[str, ...], frozenset[str], re.Pattern[str] | None], ...] = (
    ("attention", ("flash", "fmha", "attention", "sdpa"), (), frozenset(), None),
    ("gemm", ("gemm", "cutlass", "cublas", "xmma", "matmul"), (),
     frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::linear"}),
     re.compile(r"sm\d+_")),  # kernels named for their architecture (sm80_xmma_...)
    ("conv", ("conv",), (), frozenset(), None),
    ("elementwise", ("elementwise", "vectorized"),
     ("aten::add", "aten::mul", "aten::sub", "aten::div", "aten::gelu", "aten::relu"), frozenset(), None),
    ("reduction", ("reduce_kernel", "reduction", "layer_norm", "softmax"), ("aten::sum", "aten::mean"), frozenset(),
     None),
    ("copy", ("copy", "catarraybatched", "index", "scatter", "gather"), ("memcpy", "memset"), frozenset(), None),
)
MEMORY_BOUND_PROXY = frozenset({"elementwise", "reduction", "copy"})


def subcategory(name: str, cls: EventClass) -> str:
    """A finer, name-based label for top-kernel tables (``gemm``, ``elementwise``, ``allreduce``...)."""
    if cls is EventClass.comm:
        low = name.lower()
        for op in (
            "allreduce",
            "all_reduce",
            "allgather",
            "all_gather",
            "reducescatter",
            "reduce_scatter",
            "alltoall",
            "all_to_all",
            "broadcast",
            "sendrecv",
            "send",
            "recv",
            "reduce",
        ):
            if op in low:
                return op.replace("_", "")
        return "collective"
    low = name.lower()
    for label, parts, prefixes, names, pattern in _SUBCATEGORIES:
        if (any(part in low for part in parts) or low.startswith(prefixes) or low in names
                or (pattern is not None and pattern.search(low))):
            return label
    return "other"


def short_name(name: str) -> str:
    """Drop template and argument lists: ``void at::foo<float>(int)`` -> ``at::foo``."""
    depth = 0
    out: list[str] = []
    for ch in name.replace("->", ""):
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(ch)
    text = "".join(out).strip()
    if text.startswith("void "):
        text = text[5:]
    return text or name
