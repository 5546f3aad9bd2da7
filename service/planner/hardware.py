"""The hardware catalog: per-GPU memory, dense peak FLOP/s per precision, bandwidths and calibration.

Peaks are dense tensor-core figures from the vendors' datasheets (never the with-sparsity ones:
H100 SXM bf16 is 989 TFLOP/s, not 1979). `fp32` is plain FP32 (PyTorch leaves TF32 off for matmuls
by default). Bandwidths are per GPU and unidirectional, in GB/s (10^9 bytes/s).

`matmul_efficiency` is the fraction of peak that large GEMMs reach in a training step; it is a
calibration constant (docs/planner.md): A100's is set so that the planner reproduces the published
throughput of Narayanan et al.'s 1T-parameter run on 3072 A100s (502 PFLOP/s, 163 TFLOP/s per
GPU) within 10%; the others are set relative to it from the same kind of public reports and
are the first numbers to refine with measurements from the runtime.

`flash_attention_efficiency` is the fraction of peak flash attention reaches, a figure per GPU
kind with its source: FlashAttention-2 kernels are not GEMMs (softmax, masking and the online
rescaling sit between their matmuls). A100: 0.60, the middle of the 50-73% of peak that
FlashAttention-2's paper reports on A100 (Dao 2023, arXiv:2307.08691). Hopper (H100, H200): 0.35,
FlashAttention-3's paper (Shah et al. 2024, arXiv:2407.08608: "FlashAttention-2 achieving only 35%
utilization on the H100 GPU"; PyTorch's SDPA flash backend is FlashAttention-2). Others: no
published figure found; the GEMMs' efficiency.

FP8 (per-tensor scaled matmuls in the linear layers, bf16 elsewhere) is not the fp8/bf16 peak ratio
(2x): `fp8_gemm_speedup` is the large-GEMM limit of an FP8 GEMM's speed over the bf16 GEMM, and
`fp8_gemm_gain` shrinks it for small GEMMs; the planner adds the dynamic-scaling work (amax, casts)
on top (`service.planner.timing.linear_seconds`). Sources, docs/planner.md "FP8":

- H100 (SXM, PCIe) and H200 (the same Hopper tensor cores): 1.77, set so that the model reproduces
  the torchao.float8 README's H100 microbenchmarks of one linear's forward + backward (tensorwise
  dynamic scaling, torch.compile): 0.80x at M, K, N = 1024, 2048, 1024 and 1.39x at 4096, 8192,
  16384; the README's end-to-end Llama-3-8B run on 8 H100 (FSDP2, per-op SAC, seq 8192: 1.25x)
  checks it.
- MI300X: 1.42, set so that the model gives torchao's end-to-end Llama-3-8B figure on 8 MI300X
  (tensorwise: 1.147x, same recipe as the H100 run).
- B200, L40S: no per-tensor FP8 GEMM benchmark found; the Hopper value is assumed (torchao reports
  1.28x end to end for MXFP8, a different recipe, on B200). Refine with measurements.
- V100, A100: no FP8 tensor cores, so no `fp8` peak: `training.precision: fp8` is refused.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from service.planner.errors import FieldProblem, InvalidSpec
from service.spec import Precision, Resources

GIB = 1024**3
GB = 10**9
#: GEMM rows (and the smaller of its other two sizes) at which fp8's gain over bf16 is half way up.
FP8_GAIN_HALF = 1024
#: Hopper's large-GEMM fp8 gain (1.77) over its fp8/bf16 peak ratio (2): for GPUs given inline.
FP8_SHARE_OF_PEAK_RATIO = 0.885


class GpuType(BaseModel):
    """One accelerator kind. `memory_gib` is per device; for `cpu` it is per node (shared)."""

    model_config = ConfigDict(frozen=True)

    name: str
    memory_gib: float
    peak_tflops: dict[Precision, float]
    hbm_gbps: float
    intra_node_gbps: float
    inter_node_gbps: float
    pcie_gbps: float
    matmul_efficiency: float
    cpu_memory_gib: float = 1024.0
    runtime_base_gib: float = 0.5
    communicator_gib: float = 0.75
    memory_shared_per_node: bool = False
    latency_intra_s: float = 5e-6
    latency_inter_s: float = 15e-6
    launch_overhead_s: float = 4e-6
    comm_library: str = "nccl"
    #: Whether a collective whose group has k ranks in each node runs k rings at once, one per
    #: rank's NIC (NCCL and RCCL over NVLink/xGMI-connected GPUs); gloo between CPU processes does
    #: not: they share the node's network.
    multi_nic_rings: bool = True
    fp8_gemm_speedup: float | None = None  # large-GEMM limit of fp8 over bf16; None: 0.885 x peak ratio
    #: Fraction of the dense peak that flash attention kernels (FlashAttention-2 class, as PyTorch's
    #: SDPA runs them) reach, forward and backward, at long sequences; None: the GEMMs' efficiency.
    flash_attention_efficiency: float | None = None

    def supports(self, precision: Precision) -> bool:
        return precision in self.peak_tflops

    def fp8_gemm_gain(self, m: float, k: float, n: float) -> float:
        """bf16 GEMM time over fp8 GEMM time for an (m x k) @ (k x n) product, the scaling work excluded.

        1 + (G - 1) * m / (m + 1024) * w / (w + 1024) with w = min(k, n) and G = `fp8_gemm_speedup`
        (for a GPU given inline without one, 0.885 of its fp8/bf16 peak ratio, Hopper's share):
        large GEMMs approach G, small ones gain little, as the torchao.float8 README's table shows.
        Only meaningful where `supports("fp8")`.
        """
        g = self.fp8_gemm_speedup
        if g is None:
            g = FP8_SHARE_OF_PEAK_RATIO * self.peak_tflops.get("fp8", 0.0) / self.peak_tflops.get("bf16", 1.0)
        w = min(k, n)
        return 1.0 + (max(g, 1.0) - 1.0) * m / (m + FP8_GAIN_HALF) * w / (w + FP8_GAIN_HALF)


def _gpu(name: str, memory_gib: float, peaks: dict[Precision, float], **kw: float | str | bool) -> GpuType:
    return GpuType.model_validate({"name": name, "memory_gib": memory_gib, "peak_tflops": peaks, **kw})


CATALOG: dict[str, GpuType] = {
    g.name: g
    for g in (
        _gpu("V100-SXM-32GB", 32, {"fp16": 125, "fp32": 15.7}, hbm_gbps=900, intra_node_gbps=150,
             inter_node_gbps=12.5, pcie_gbps=12, matmul_efficiency=0.65, cpu_memory_gib=512),
        _gpu("A100-SXM-40GB", 40, {"bf16": 312, "fp16": 312, "fp32": 19.5}, hbm_gbps=1555,
             intra_node_gbps=300, inter_node_gbps=25, pcie_gbps=25, matmul_efficiency=0.72,
             cpu_memory_gib=1024, flash_attention_efficiency=0.60),
        _gpu("A100-SXM-80GB", 80, {"bf16": 312, "fp16": 312, "fp32": 19.5}, hbm_gbps=2039,
             intra_node_gbps=300, inter_node_gbps=25, pcie_gbps=25, matmul_efficiency=0.72,
             cpu_memory_gib=2048, flash_attention_efficiency=0.60),
        _gpu("H100-SXM-80GB", 80, {"bf16": 989, "fp16": 989, "fp8": 1979, "fp32": 67}, hbm_gbps=3350,
             intra_node_gbps=450, inter_node_gbps=50, pcie_gbps=50, matmul_efficiency=0.62,
             cpu_memory_gib=2048, fp8_gemm_speedup=1.77, flash_attention_efficiency=0.35),
        # Meta's Grand Teton H100 (torchtitan's H100 benchmarks): SXM, 96 GB HBM2e (95 GiB usable as
        # torchtitan reports it), 500 W instead of 700 W. torchtitan: its peak "is between SXM and
        # NVL, and we don't know its exact value". The tensor-core clock a power limit sustains sets
        # the dense peak: NVIDIA lists 989 TFLOP/s bf16 at 700 W (SXM) and 835 at 400 W (H100 NVL),
        # same 132 SMs; linear in the power limit, 500 W gives 886. HBM2e: six stacks at the H100
        # PCIe's HBM2e rate (2,000 GB/s from five) give 2,400 GB/s. GEMM efficiency, NVLink and the
        # 400 Gb/s NIC per GPU as the SXM part.
        _gpu("H100-SXM-96GB-500W", 95, {"bf16": 886, "fp16": 886, "fp8": 1772, "fp32": 60}, hbm_gbps=2400,
             intra_node_gbps=450, inter_node_gbps=50, pcie_gbps=50, matmul_efficiency=0.62,
             cpu_memory_gib=2048, fp8_gemm_speedup=1.77, flash_attention_efficiency=0.35),
        _gpu("H100-PCIe-80GB", 80, {"bf16": 756, "fp16": 756, "fp8": 1513, "fp32": 51}, hbm_gbps=2000,
             intra_node_gbps=50, inter_node_gbps=25, pcie_gbps=50, matmul_efficiency=0.60,
             cpu_memory_gib=1024, fp8_gemm_speedup=1.77, flash_attention_efficiency=0.35),
        _gpu("H200-SXM-141GB", 141, {"bf16": 989, "fp16": 989, "fp8": 1979, "fp32": 67}, hbm_gbps=4800,
             intra_node_gbps=450, inter_node_gbps=50, pcie_gbps=50, matmul_efficiency=0.64,
             cpu_memory_gib=2048, fp8_gemm_speedup=1.77, flash_attention_efficiency=0.35),
        _gpu("B200-180GB", 180, {"bf16": 2250, "fp16": 2250, "fp8": 4500, "fp32": 80}, hbm_gbps=8000,
             intra_node_gbps=900, inter_node_gbps=50, pcie_gbps=50, matmul_efficiency=0.55,
             cpu_memory_gib=4096, fp8_gemm_speedup=1.77),
        _gpu("L40S-48GB", 48, {"bf16": 362, "fp16": 362, "fp8": 733, "fp32": 91.6}, hbm_gbps=864,
             intra_node_gbps=25, inter_node_gbps=25, pcie_gbps=25, matmul_efficiency=0.60,
             cpu_memory_gib=1024, fp8_gemm_speedup=1.77),
        _gpu("MI300X-192GB", 192, {"bf16": 1307, "fp16": 1307, "fp8": 2615, "fp32": 163.4}, hbm_gbps=5300,
             intra_node_gbps=448, inter_node_gbps=50, pcie_gbps=50, matmul_efficiency=0.50,
             cpu_memory_gib=2048, comm_library="rccl", fp8_gemm_speedup=1.42),
        # Worker processes on CPU cores, talking gloo: for the embedded default, demos and tests.
        # `memory_gib` is the node's RAM, shared by its processes; peaks are per process, set from the
        # runtime's measured step time of examples/tiny-cpu.yaml on a 2-core VM (fp32 matmul).
        _gpu("cpu", 16, {"fp32": 0.13, "bf16": 0.06, "fp16": 0.06}, hbm_gbps=10, intra_node_gbps=2,
             inter_node_gbps=1.25, pcie_gbps=1000, matmul_efficiency=0.5, cpu_memory_gib=16, runtime_base_gib=0.35,
             communicator_gib=0.01, memory_shared_per_node=True, latency_intra_s=30e-6,
             latency_inter_s=100e-6, launch_overhead_s=20e-6, comm_library="gloo", multi_nic_rings=False),
    )
}


class Cluster(BaseModel):
    """The resolved resources: which GPU, how many, and the fabric between them."""

    model_config = ConfigDict(frozen=True)

    gpu: GpuType
    nodes: int
    gpus_per_node: int
    world_size: int
    intra_node_gbps: float
    inter_node_gbps: float
    cpu_memory_gib: float

    @property
    def memory_bytes_per_gpu(self) -> int:
        """What one rank may use: the device's memory, or its share of the node's RAM on `cpu`."""
        per_device = self.gpu.memory_gib * GIB
        if self.gpu.memory_shared_per_node:
            per_device /= min(self.gpus_per_node, self.world_size)
        return int(per_device)

    def link_gbps(self, span: int) -> float:
        """Per-GPU bandwidth of a group whose ranks span `span` consecutive ranks."""
        return self.intra_node_gbps if span <= self.gpus_per_node else self.inter_node_gbps

    def collective_gbps(self, n: int, span: int) -> float:
        """Bus bandwidth per GPU of a ring collective (all-reduce, all-gather, reduce-scatter) over
        `n` ranks spaced evenly across `span` consecutive ranks.

        Inside a node: NVLink. Across nodes, with k = the group's ranks per node: NCCL builds one
        ring channel per NIC and splits the data over them through NVLink, so the k NICs work at
        once and the bus bandwidth is min(NVLink, k x per-GPU network) (NVIDIA/nccl issue 601;
        nccl-tests doc/PERFORMANCE.md for bus bandwidth). A group with one rank per node (tp = GPUs
        per node) gets one NIC. Point-to-point sends use `link_gbps`.
        """
        if span <= self.gpus_per_node:
            return self.intra_node_gbps
        if not self.gpu.multi_nic_rings:
            return self.inter_node_gbps
        stride = max(1, span // max(n, 1))
        per_node = min(n, max(1, self.gpus_per_node // stride))
        return min(self.intra_node_gbps, per_node * self.inter_node_gbps)

    def latency_s(self, span: int) -> float:
        return self.gpu.latency_intra_s if span <= self.gpus_per_node else self.gpu.latency_inter_s


def resolve_cluster(resources: Resources) -> Cluster:
    """Resolve the spec's resources against the catalog; raise `InvalidSpec` naming the field."""
    ref = resources.gpu
    name = ref if isinstance(ref, str) else ref.name
    base = CATALOG.get(name)
    if base is None:
        lowered = {k.lower(): v for k, v in CATALOG.items()}
        base = lowered.get(name.lower())
    if base is None:
        if isinstance(ref, str) or ref.memory_gib is None or not ref.peak_tflops:
            raise InvalidSpec([FieldProblem(
                loc=("resources", "gpu"),
                message=f"unknown GPU {name!r}; use one of {', '.join(CATALOG)}, or give"
                " {name, memory_gib, peak_tflops} for a GPU the catalog does not know",
            )])
        base = GpuType(
            name=name, memory_gib=ref.memory_gib, peak_tflops=dict(ref.peak_tflops),
            hbm_gbps=ref.hbm_gbps or 2000, intra_node_gbps=resources.intra_node_gbps or 100,
            inter_node_gbps=resources.inter_node_gbps or 25, pcie_gbps=25, matmul_efficiency=0.55,
        )
    elif not isinstance(ref, str):
        updates: dict[str, object] = {}
        if ref.memory_gib is not None:
            updates["memory_gib"] = ref.memory_gib
        if ref.peak_tflops:
            updates["peak_tflops"] = {**base.peak_tflops, **ref.peak_tflops}
        if ref.hbm_gbps is not None:
            updates["hbm_gbps"] = ref.hbm_gbps
        base = base.model_copy(update=updates)
    world = resources.world_size
    gpn = min(resources.gpus_per_node, world)
    return Cluster(
        gpu=base,
        nodes=resources.node_count,
        gpus_per_node=gpn,
        world_size=world,
        intra_node_gbps=resources.intra_node_gbps or base.intra_node_gbps,
        inter_node_gbps=resources.inter_node_gbps or base.inter_node_gbps,
        cpu_memory_gib=resources.cpu_memory_gib or base.cpu_memory_gib,
    )
