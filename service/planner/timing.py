"""Step time of one layout: compute, recompute, exposed communication, pipeline bubble, optimizer, offload.

FLOP convention (`FLOP_CONVENTION`), one for FLOPs, MFU and time: 6 x (matmul parameters: every
layer plus the output layer, not the embedding lookup) x tokens + 6 x layers x hidden x seq x tokens
for attention scores, that is causal attention counted at half the full-attention FLOPs (the
decoder's mask leaves half the score matrix unused), without recompute. This is convention (b) of
planner-formulas.md §4.4 (NeMo since 2025-08, Megatron-Bridge 25.09+); torchtitan and Korthikanti
Eq. 7 count the attention term in full (12 x ...), which overstates MFU at long sequences. The time
model charges the same causal half for flash attention, whose kernels skip the masked blocks;
eager attention computes the whole masked square, so its kernel time is twice the attention FLOPs
it is credited with (eager runs show a lower MFU, which is the truth).

Activation checkpointing: `full` replays each layer's forward; `selective` (eager attention only)
the attention core; `op` (torchtitan's op-level policy, `layer_matmuls`) the matmuls it did not save
(the 2nd, 4th, ... of each layer: `op_recomputed_share` of the layer's matmul time) and every
memory-bound op of the layer (timed by bytes, like the forward), but not attention.

FP8 (`training.precision: fp8`): the linear layers' GEMMs run at the bf16 rate times the GPU's
`fp8_gemm_gain` for their size, plus per-tensor dynamic scaling (`FP8_SCALING_BYTES` per element of
input, weight and output gradient at HBM bandwidth); attention and the output layer stay bf16
(torchtitan's float8 converter leaves `output` alone). `linear_seconds` is one linear on its own.

Communication uses a latency + bandwidth model per collective (ring volumes, tree latency) on the
fabric the group crosses: NVLink when the group's ranks sit in one node, the network otherwise.
Ranks are ordered pp, dp, cp, tp (tp innermost), so a group's span is its size times its stride.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from service.planner.hardware import Cluster, GpuType
from service.planner.layer_matmuls import layer_matmuls, op_recomputed_share
from service.planner.layout import Layout
from service.planner.memory import (
    StageParams,
    activation_element_bytes,
    compute_param_bytes,
    layer_activation_bytes,
    layers_per_stage,
    stage_params,
)
from service.planner.models import ModelShape
from service.spec import Optimizer, Precision

FLOP_CONVENTION = (
    "6 x matmul params (layers + output layer, no embedding lookup) x tokens + 6 x layers x hidden"
    " x seq x tokens (causal attention counted at half the full-attention FLOPs); recompute excluded"
    " (NeMo/Megatron-Bridge convention; the step time charges flash attention the same causal half)"
)
# The share of the full s x s attention FLOPs a causal decoder is credited with (FLOPs, MFU) and a
# flash kernel spends (time); eager attention spends the full square (`ATTENTION_KERNEL_SHARE`).
CAUSAL_ATTENTION_SHARE = 0.5
ATTENTION_KERNEL_SHARE: dict[str, float] = {"flash": CAUSAL_ATTENTION_SHARE, "eager": 1.0}
COMM_EFFICIENCY = 0.8
#: Fraction of the HBM peak that streaming kernels sustain: the `scale` kernel of cuda-stream (one
#: load and one store stream, te42kyfo/gpu-benches README) reaches 788 of V100's 900 GB/s.
HBM_STREAM_EFFICIENCY = 0.87
#: HBM passes of a memory-bound op (norm, activation, residual add, softmax, dropout) per byte of
#: the activation it stores: it reads its input and writes its output.
MEMORY_BOUND_PASSES = 2
DDP_BUCKET_BYTES = 25 * 2**20
KERNELS_PER_LAYER = 25
CPU_OPTIMIZER_GBPS_PER_NODE = 200.0
OPTIMIZER_STEP_BYTES: dict[str, int] = {"adamw": 28, "adam": 28, "sgd": 20, "adam8bit": 16}
#: Dynamic per-tensor fp8 scaling, per element of each scaled tensor: the amax pass reads bf16 (2),
#: the cast reads it again (2) and writes the fp8 copy and its transpose for backward (1 + 1).
FP8_SCALING_BYTES = 6
#: Extra TP collectives per layer that `op` checkpointing replays in backward: the all-reduce after
#: the recomputed o projection (without SP), or the two all-gathers before recomputed k and w3 (SP).
OP_RECOMPUTE_TP_COLLECTIVES = 1


def fsdp_copy_bytes(precision: Precision, *, gathers: int) -> tuple[float, float]:
    """HBM bytes that FSDP2 (`fully_shard`) moves around its collectives, as a pair: (bytes per
    unit parameter per micro-batch on the compute stream, bytes per shard element per all-gather
    on the all-gather copy-in stream). Source: torch `distributed/fsdp/_fully_shard/_fsdp_collectives.py`.

    Compute stream (compute waits for these):
    - after each all-gather, `foreach_all_gather_copy_out` splits the gathered flat buffer into the
      per-parameter tensors (`split_with_sizes_copy`): each parameter read and written in the
      compute dtype, 2 x lowp, `gathers` times per micro-batch (2 when a unit is resharded after
      forward, 1 for zero2);
    - before each reduce-scatter, `foreach_reduce_scatter_copy_in` concatenates the unit's
      gradients (compute dtype) into the fp32 reduce-scatter input (`chunk_cat`, widening): lowp
      read + 4 written. fp32 and bf16 reduce with NCCL's average (pytorch PRs 120919, 123362), so
      there is no division pass.
    Copy-in stream, before each all-gather (it delays the gather, not compute): under a
    mixed-precision policy each fp32 shard is cast to the compute dtype (4 read + lowp written)
    and copied into the all-gather input (lowp read + lowp written); fp32 has no policy and only
    copies (4 + 4).
    """
    lowp = compute_param_bytes(precision)
    per_micro_batch = gathers * 2 * lowp + lowp + 4
    cast = 4 + lowp if precision != "fp32" else 0
    return float(per_micro_batch), float(cast + 2 * lowp)


def model_flops_per_step(shape: ModelShape, global_batch: int) -> float:
    """Model FLOPs of one optimizer step under `FLOP_CONVENTION`."""
    tokens = global_batch * shape.seq_len
    attention = CAUSAL_ATTENTION_SHARE * 12 * shape.layers * shape.hidden * shape.seq_len * tokens
    return 6 * shape.matmul_params * tokens + attention


def recompute_flops_per_step(shape: ModelShape, global_batch: int, checkpointing: str, attention: str) -> float:
    """Extra forward FLOPs that activation checkpointing spends (full: every layer; selective: the
    attention core, only stored when attention is eager), counted under `FLOP_CONVENTION`."""
    tokens = global_batch * shape.seq_len
    core = CAUSAL_ATTENTION_SHARE * 4 * shape.layers * shape.hidden * shape.seq_len * tokens
    if checkpointing == "full":
        return 2 * shape.layers * shape.layer_matmul_params * tokens + core
    if checkpointing == "selective" and attention == "eager":
        return core
    if checkpointing == "op":
        return 2 * shape.layers * shape.layer_matmul_params * op_recomputed_share(shape) * tokens
    return 0.0


@dataclass(frozen=True, slots=True)
class Fabric:
    """Collective times on a cluster, in seconds, for messages in bytes."""

    cluster: Cluster

    def _bw(self, n: int, span: int) -> float:
        return self.cluster.collective_gbps(n, span) * 1e9 * COMM_EFFICIENCY

    def all_reduce(self, nbytes: float, n: int, span: int) -> float:
        if n <= 1:
            return 0.0
        lat = self.cluster.latency_s(span) * 2 * math.ceil(math.log2(n))
        return lat + 2 * (n - 1) / n * nbytes / self._bw(n, span)

    def all_gather(self, nbytes: float, n: int, span: int) -> float:
        """Gather (or reduce-scatter) a tensor of `nbytes` in total across `n` ranks."""
        if n <= 1:
            return 0.0
        lat = self.cluster.latency_s(span) * math.ceil(math.log2(n))
        return lat + (n - 1) / n * nbytes / self._bw(n, span)

    def p2p(self, nbytes: float, span: int) -> float:
        """One send between two ranks `span` apart: one link (NVLink, or one NIC across nodes)."""
        return self.cluster.latency_s(span) + nbytes / (self.cluster.link_gbps(span) * 1e9 * COMM_EFFICIENCY)


@dataclass(frozen=True, slots=True)
class StepTime:
    compute_s: float
    recompute_s: float
    comm_exposed_s: float
    bubble_s: float
    optimizer_s: float
    offload_s: float
    comm_dp: float
    comm_tp: float
    comm_pp: float
    comm_cp: float
    comm_offload: float

    @property
    def step_s(self) -> float:
        return (self.compute_s + self.recompute_s + self.comm_exposed_s + self.bubble_s
                + self.optimizer_s + self.offload_s)


def _efficiency(cluster: Cluster, tokens: int, width: float) -> float:
    """Fraction of peak a GEMM of `tokens` rows and `width` columns reaches: small GEMMs lose."""
    return gemm_efficiency(cluster.gpu, tokens, width)


def gemm_efficiency(gpu: GpuType, tokens: float, width: float) -> float:
    """Fraction of peak a GEMM of `tokens` rows and `width` columns reaches: small GEMMs lose."""
    return gpu.matmul_efficiency * tokens / (tokens + 256) * width / (width + 128)


def linear_seconds(gpu: GpuType, m: float, k: float, n: float, precision: Precision) -> float:
    """Forward + backward seconds of one linear layer on its own: three GEMMs of 2mkn FLOPs
    (output, input gradient, weight gradient), each one kernel launch.

    fp8: the GEMMs run at the bf16 rate times `gpu.fp8_gemm_gain(m, k, n)`, and the input (m x k),
    the weight (k x n) and the output gradient (m x n) are each scaled and cast by one kernel that
    moves `FP8_SCALING_BYTES` per element. Other precisions: the GEMMs at their own peak.
    """
    dense = "bf16" if precision == "fp8" else precision
    rate = gpu.peak_tflops[dense] * 1e12 * gemm_efficiency(gpu, m, min(k, n))
    gemms = 6 * m * k * n / rate
    launches = 3
    if precision != "fp8":
        return gemms + launches * gpu.launch_overhead_s
    scaling = FP8_SCALING_BYTES * (m * k + k * n + m * n) / (gpu.hbm_gbps * 1e9)
    return gemms / gpu.fp8_gemm_gain(m, k, n) + scaling + (launches + 3) * gpu.launch_overhead_s


def _fp8_layer_matmul_seconds(shape: ModelShape, gpu: GpuType, *, tokens: int, tp: int, rate: float) -> float:
    """Forward seconds of one layer's linear layers in fp8 (bf16 `rate` FLOP/s x the GEMM's gain),
    plus a third of their fwd+bwd scaling work (the step charges backward at twice the forward)."""
    mms = layer_matmuls(shape)
    scale = shape.layer_matmul_params / sum(m.params for m in mms)  # the spec's `params` may rescale
    gemm = scaled = 0.0
    for mm in mms:
        k = mm.k / tp if mm.row_parallel else float(mm.k)
        n = float(mm.n) if mm.row_parallel else mm.n / tp
        gemm += 2 * tokens * k * n * scale / (rate * gpu.fp8_gemm_gain(tokens, k, n))
        scaled += tokens * k + k * n * scale + tokens * n
    scaling = FP8_SCALING_BYTES * scaled / (gpu.hbm_gbps * 1e9) + 3 * len(mms) * gpu.launch_overhead_s
    return gemm + scaling / 3


@dataclass(frozen=True, slots=True)
class ForwardTimes:
    """Forward seconds of one micro-batch on the slowest stage, split the way recompute needs them."""

    layer_f: float
    attn_f: float
    head_f: float
    layers: int
    op_recompute_f: float = 0.0  # what `op` checkpointing replays of one layer


def forward_times(shape: ModelShape, cluster: Cluster, layout: Layout, *, precision: Precision,
                  attention: str) -> ForwardTimes:
    """Depends only on tp, cp, pp, micro-batch and sequence parallelism (the search caches it)."""
    gpu = cluster.gpu
    t, cp = layout.tp, layout.cp
    b = layout.micro_batch
    s_loc = shape.seq_len // cp
    tokens = b * s_loc
    e = activation_element_bytes(precision)
    hbm = gpu.hbm_gbps * 1e9 * HBM_STREAM_EFFICIENCY
    # fp8 runs only the linear layers' GEMMs in fp8: attention and the output layer stay bf16.
    dense = gpu.peak_tflops["bf16" if precision == "fp8" else precision] * 1e12
    eff = _efficiency(cluster, tokens, shape.hidden / t)
    causal = ATTENTION_KERNEL_SHARE[attention]
    if precision == "fp8":
        mm_f = _fp8_layer_matmul_seconds(shape, gpu, tokens=tokens, tp=t, rate=dense * eff)
    else:
        mm_f = 2 * tokens * shape.layer_matmul_params / t / (dense * eff)
    # Flash kernels run at their own efficiency (`flash_attention_efficiency`); eager attention is
    # two batched GEMMs (its softmax is memory-bound work, below).
    attn_eff = eff
    if attention == "flash" and gpu.flash_attention_efficiency is not None:
        attn_eff = eff * gpu.flash_attention_efficiency / gpu.matmul_efficiency
    attn_f = causal * 4 * b * s_loc * shape.seq_len * shape.hidden / t / (dense * attn_eff)
    act_bytes = layer_activation_bytes(
        shape, micro_batch=b, seq_local=s_loc, tp=t, sequence_parallel=layout.sequence_parallel,
        checkpointing="none", attention=attention, precision=precision)
    memory_bound = MEMORY_BOUND_PASSES * act_bytes / hbm + KERNELS_PER_LAYER * gpu.launch_overhead_s
    layer_f = mm_f + attn_f + memory_bound
    op_recompute_f = op_recomputed_share(shape) * mm_f + memory_bound
    if cp > 1:
        # Ring attention runs one attention kernel per ring step and merges the partial outputs
        # (fp32 output and log-sum-exp) after each.
        merge = (cp - 1) * 2 * tokens * shape.hidden / t * 4 / hbm
        layer_f += merge + (cp - 1) * 4 * gpu.launch_overhead_s
        attn_f += merge
    head_f = 2 * tokens * shape.vocab * shape.hidden / t / (dense * eff) + (e + 8) * tokens * shape.vocab / t / hbm
    return ForwardTimes(layer_f=layer_f, attn_f=attn_f, head_f=head_f,
                        layers=layers_per_stage(shape, layout.pp), op_recompute_f=op_recompute_f)


def step_time(shape: ModelShape, cluster: Cluster, layout: Layout, *, precision: Precision,
              optimizer: Optimizer, attention: str, forward: ForwardTimes | None = None,
              stages: StageParams | None = None) -> StepTime:
    """Seconds per optimizer step on the slowest pipeline stage (the last: it adds the output layer).

    `forward` may carry `forward_times` of a layout with the same tp, cp, pp, micro-batch and SP,
    `stages` the `stage_params` of one with the same tp and pp.
    """
    gpu = cluster.gpu
    t, p, cp, v = layout.tp, layout.pp, layout.cp, layout.virtual_stages
    b, m = layout.micro_batch, layout.grad_accum_steps
    s_loc = shape.seq_len // cp
    tokens = b * s_loc
    e = activation_element_bytes(precision)
    if stages is None:
        stages = stage_params(shape, layout)
    if forward is None:
        forward = forward_times(shape, cluster, layout, precision=precision, attention=attention)
    layers, layer_f, attn_f = forward.layers, forward.layer_f, forward.attn_f
    t_f = layers * layer_f + forward.head_f
    t_b = 2 * t_f
    ckpt = layout.activation_checkpointing
    if ckpt == "full":
        t_r = layers * layer_f
    elif ckpt == "selective" and attention == "eager":
        t_r = layers * attn_f
    elif ckpt == "op":
        t_r = layers * forward.op_recompute_f
    else:
        t_r = 0.0
    fabric = Fabric(cluster)

    # Tensor parallel: 2 all-reduces (or all-gather + reduce-scatter with SP) forward, 2 backward,
    # 2 more when full recompute replays the forward, 1 for `op`; on the critical path.
    tp_msg = tokens * shape.hidden * e
    replayed = {"full": 2, "op": OP_RECOMPUTE_TP_COLLECTIVES}.get(ckpt, 0)
    tp_colls = layers * (4 + replayed)
    tp_time = tp_colls * fabric.all_reduce(tp_msg, t, t)
    tp_bytes = tp_colls * 2 * (t - 1) / t * tp_msg if t > 1 else 0.0

    # Context parallel (ring attention): K and V go around the ring forward, K, V, dK, dV backward;
    # overlapped with the attention core.
    cp_time = cp_bytes = 0.0
    if cp > 1:
        kv = 2 * b * s_loc * shape.kv_hidden / t * e
        span = t * cp
        cp_f = (cp - 1) * fabric.p2p(kv, span)
        cp_time = layers * (max(0.0, cp_f - attn_f) + max(0.0, 2 * cp_f - 2 * attn_f))
        cp_bytes = layers * 3 * (cp - 1) * kv * m

    # Pipeline: one activation forward and one gradient backward per micro-batch and chunk; about
    # half of it hides behind compute in the steady state. Each TP rank sends to its peer over its
    # own link. With SP a rank holds 1/t of the activation. Without SP every TP rank holds all of
    # it: DDP/ZeRO-1 with TP are Megatron-LM's layouts (shardctl's runtime does not build them),
    # and Megatron's scatter/gather (Narayanan et al. 2021, sec. 4.1; on by default) sends 1/t from
    # each rank and all-gathers it over NVLink on arrival; shardctl's runtime
    # (torch.distributed.pipelining) sends the whole tensor from each rank.
    pp_time = pp_bytes = 0.0
    if p > 1:
        full = tokens * shape.hidden * e
        scatter_gather = t > 1 and not layout.sequence_parallel and layout.sharding in ("ddp", "zero1")
        pp_msg = full / t if layout.sequence_parallel or scatter_gather else full
        pp_span = 2 * layout.dp * cp * t
        gather = fabric.all_gather(full, t, t) if scatter_gather else 0.0
        pp_time = 0.5 * 2 * m * v * (fabric.p2p(pp_msg, pp_span) + gather)
        pp_bytes = 2 * m * v * pp_msg

    # Data parallel.
    psi = stages.last if p > 1 else stages.first
    dp_n = layout.dp * cp
    dp_span = t * dp_n
    lowp = compute_param_bytes(precision)
    sharding = layout.sharding
    units = layers + 1
    hbm = gpu.hbm_gbps * 1e9 * HBM_STREAM_EFFICIENCY
    per_mb_dp = once_dp = dp_bytes = fsdp_copy_s = copy_in_s = 0.0
    if sharding in ("ddp", "zero1"):
        ar = fabric.all_reduce(4 * psi, dp_n, dp_span)
        last_bucket = ar * min(1.0, DDP_BUCKET_BYTES / max(4 * psi, 1.0))
        once_dp = max(ar - t_b, last_bucket)
        dp_bytes = 2 * (dp_n - 1) / dp_n * 4 * psi if dp_n > 1 else 0.0
        if sharding == "zero1" and dp_n > 1:
            once_dp += fabric.all_gather(4 * psi, dp_n, dp_span)
            dp_bytes += (dp_n - 1) / dp_n * 4 * psi
    else:
        n = layout.shard_group
        shard_span = t * n
        gathers = 1 if sharding == "zero2" else 2
        if dp_n > 1:
            copy_bytes, copy_in_bytes = fsdp_copy_bytes(precision, gathers=gathers)
            fsdp_copy_s = copy_bytes * psi / hbm
            copy_in_s = copy_in_bytes * psi / n / hbm
        ag = fabric.all_gather(lowp * psi, n, shard_span) + copy_in_s
        rs = fabric.all_gather(4 * psi, n, shard_span)
        replicas = layout.replicas
        ar_rep = fabric.all_reduce(4 * psi / n, replicas, dp_span) if replicas > 1 else 0.0
        ag_b = ag if sharding != "zero2" else 0.0
        exposed_f = max(0.0, ag - t_f) + ag / units
        exposed_b = max(0.0, ag_b + rs + ar_rep - t_b - t_r) + (rs + ar_rep) / units
        per_mb_dp = exposed_f + exposed_b
        if n > 1:
            dp_bytes = m * (n - 1) / n * (gathers * lowp * psi + 4 * psi)
        if replicas > 1:
            dp_bytes += m * 2 * (replicas - 1) / replicas * 4 * psi / n

    # Optimizer step (memory-bound over the local shard) and offload traffic.
    shard = psi / layout.shard_group
    optimizer_s = OPTIMIZER_STEP_BYTES[optimizer] * shard / hbm
    offload_s = offload_bytes = 0.0
    if layout.offload != "none":
        node_share = min(cluster.gpus_per_node, cluster.world_size)
        cpu_opt = OPTIMIZER_STEP_BYTES[optimizer] * shard / (CPU_OPTIMIZER_GBPS_PER_NODE * 1e9 / node_share)
        pcie = gpu.pcie_gbps * 1e9
        if layout.offload == "optimizer":
            offload_bytes = 8 * shard
            offload_s = cpu_opt + offload_bytes / pcie
        else:
            offload_bytes = m * 3 * 4 * shard
            offload_s = cpu_opt + max(0.0, offload_bytes / pcie - 0.5 * m * (t_f + t_b))
        optimizer_s = 0.0

    # FSDP2's copy-out and reduce-scatter copy-in run on the compute stream: compute time.
    compute_s = m * (t_f + t_b + fsdp_copy_s)
    recompute_s = m * t_r
    bubble_s = (p - 1) / v * (t_f + t_b + fsdp_copy_s + t_r) if p > 1 else 0.0
    comm_exposed = m * (tp_time + cp_time + per_mb_dp) + pp_time + once_dp
    return StepTime(
        compute_s=compute_s, recompute_s=recompute_s, comm_exposed_s=comm_exposed, bubble_s=bubble_s,
        optimizer_s=optimizer_s, offload_s=offload_s, comm_dp=dp_bytes, comm_tp=m * tp_bytes,
        comm_pp=pp_bytes, comm_cp=cp_bytes, comm_offload=offload_bytes,
    )
