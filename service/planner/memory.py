"""Per-GPU memory of one layout, in bytes, on the most loaded rank.

Model states follow what the runtime actually builds with PyTorch (autocast mixed precision keeps
fp32 parameters and gradients; the optimizer's state is fp32 on top):

| sharding | params | grads | optimizer |
|---|---|---|---|
| ddp | 4Ψ | 4Ψ | KΨ |
| zero1 (ZeroRedundancyOptimizer) | 4Ψ | 4Ψ | KΨ/N |
| zero2, zero3/fsdp, hsdp (FSDP2) | 4Ψ/N | 4Ψ/N | KΨ/N |

with K = 8 (Adam/AdamW: m and v), 4 (SGD momentum), 2 (8-bit Adam). DDP and FSDP totals equal
ZeRO's (2+2+12)Ψ and (2+2+12)Ψ/N; PyTorch's ZeRO-1 does not shard the fp32 master weights, so
it saves less than the paper's P_os (8Ψ + 8Ψ/N instead of 4Ψ + 12Ψ/N).

Under a pipeline (pp > 1) the fully sharded modes also hold the stage's unsharded bf16 parameters
and fp32 gradient accumulators during the step (2Ψ + 4Ψ, counted with the communication buffers).

Activations follow Korthikanti et al. (2022), generalised to grouped-query attention, SwiGLU,
RMSNorm, no dropout and flash attention; see `layer_activation_bytes`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from service.planner.hardware import GIB, Cluster
from service.planner.layer_matmuls import op_saved_elements_per_token
from service.planner.layout import Layout
from service.planner.models import ModelShape
from service.spec import Optimizer, Precision

OPTIMIZER_STATE_BYTES: dict[str, int] = {"adamw": 8, "adam": 8, "sgd": 4, "adam8bit": 2}
ALLOCATOR_MARGIN = 0.05
HOST_PROCESS_BYTES = 2 * GIB


def activation_element_bytes(precision: Precision) -> int:
    """Bytes of one stored activation element: 4 in fp32, 2 under bf16/fp16/fp8 autocast."""
    return 4 if precision == "fp32" else 2


def compute_param_bytes(precision: Precision) -> int:
    """Bytes per parameter of the low-precision copy that FSDP gathers for compute."""
    return 4 if precision == "fp32" else 2


def layers_per_stage(shape: ModelShape, pp: int) -> int:
    """Layers on the busiest pipeline stage: ceil(layers / pp)."""
    return math.ceil(shape.layers / pp)


@dataclass(frozen=True, slots=True)
class StageParams:
    """Local parameter counts (elements) on one rank: after TP splits and PP stage assignment."""

    first: float
    last: float
    largest_unit: float


def stage_params(shape: ModelShape, layout: Layout) -> StageParams:
    """Parameters held by the first and the last pipeline stage of one TP rank.

    Matmul weights split across TP; norm weights are replicated. The busiest stage gets
    ceil(layers / pp) layers; the first stage adds the embedding, the last the final norm and the
    output layer (both stages hold the tied matrix when pp > 1, as Megatron does).
    """
    t, p = layout.tp, layout.pp
    per_layer = shape.layer_matmul_params / t + shape.layer_norm_params
    layers = layers_per_stage(shape, p)
    embedding = shape.embedding_params / t
    output = shape.output_params / t
    if shape.tied_embeddings and p > 1:
        output = shape.vocab * shape.hidden / t
    head = output + shape.final_norm_params
    body = layers * per_layer
    first = body + embedding + (head if p == 1 else 0.0)
    last = body + head + (embedding if p == 1 else 0.0)
    largest = max(per_layer, embedding, output)
    return StageParams(first=first, last=last, largest_unit=largest)


@dataclass(frozen=True, slots=True)
class ModelStates:
    params: float
    grads: float
    optimizer: float
    comm_buffers: float
    cpu_bytes: float


def model_state_bytes(psi: float, largest_unit: float, layout: Layout, precision: Precision,
                      optimizer: Optimizer) -> ModelStates:
    """Params, grads and optimizer state for `psi` local parameters, plus the buffers their
    communication needs (DDP's gradient bucket copy, FSDP's gathered units), and what offload
    moves to host memory."""
    k = OPTIMIZER_STATE_BYTES[optimizer]
    n = layout.shard_group
    lowp = compute_param_bytes(precision)
    sharding = layout.sharding
    if sharding in ("ddp", "zero1"):
        params, grads = 4 * psi, 4 * psi
        opt = k * psi / (n if sharding == "zero1" else 1)
        # The runtime builds DDP with gradient_as_bucket_view=True: the gradients live inside the
        # all-reduce buckets, so there is no second copy (without it DDP would add 4Ψ, §7.9).
        comm = 0.0
    else:
        params, grads, opt = 4 * psi / n, 4 * psi / n, k * psi / n
        # One unit's gradients in low precision plus their fp32 reduce-scatter input.
        reduce = (lowp + 4) * largest_unit
        if sharding == "zero2" or layout.pp > 1:
            # zero2: unsharded params stay from forward to backward. Under a pipeline,
            # torch.distributed.pipelining (shardctl's runtime, torchtitan) keeps a stage's
            # parameters unsharded from its first micro-batch's backward to the last
            # (`set_reshard_after_backward(False)`) and accumulates unsharded gradients in the
            # fp32 reduce dtype (`set_requires_gradient_sync(False)`) until the last backward
            # reduce-scatters them.
            comm = lowp * psi + reduce
        else:
            comm = 2 * lowp * largest_unit + reduce  # current unit + the prefetched next one
    cpu = 0.0
    if layout.offload == "optimizer":
        cpu, opt = opt, 0.0
    elif layout.offload == "params":
        cpu = params + grads + opt
        params = grads = opt = 0.0
    if sharding not in ("ddp", "zero1") and layout.pp > 1:
        # The unsharded fp32 accumulators exist during the step only (the runtime's `grads` after a
        # step are the shards), and they live on the GPU, offloaded or not.
        comm += 4 * psi
    return ModelStates(params=params, grads=grads, optimizer=opt, comm_buffers=comm, cpu_bytes=cpu)


def layer_activation_bytes(shape: ModelShape, *, micro_batch: int, seq_local: int, tp: int,
                           sequence_parallel: bool, checkpointing: str, attention: str,
                           precision: Precision) -> float:
    """Bytes one transformer layer keeps for backward, for one micro-batch, on one rank.

    Korthikanti et al. Table 2 in general form (e = element bytes, 1-byte dropout masks):

    - replicated under TP, split by SP: two norm inputs (2e), the QKV input (e), the MLP input (e),
      two dropout masks (2, only with dropout) -> 10 sbh for GPT-3;
    - split by TP: Q and K (e(1+r)), V (e r) with r = kv_heads/heads, the attention output (e),
      the MLP: GeLU input and output (2e f/h), SwiGLU gate, up, activation and product (4e f/h)
      -> 24 sbh for GPT-3;
    - eager attention also stores the a s^2 b scores: softmax output (e), dropout mask (1) and
      output (e) -> 5 a s / h; flash attention stores only the fp32 log-sum-exp (4 a s b).

    `selective` recomputes the attention core (drops the s^2 terms). `full` keeps only the layer
    input (split by SP); `memory` adds the one layer rebuilt during backward. `op` (torchtitan's
    op-level policy, `layer_matmuls`) keeps the layer input, the saved matmul outputs
    (`op_saved_elements_per_token`: q, v, w1 and w2 of a Llama layer, e(2h + kv + f) sb without TP)
    and attention's outputs: its output (e sbh/t) and, under flash attention, the log-sum-exp
    (4 a s b/t), under eager attention the scores (e a s^2 b/t) instead; dropout masks are recomputed.
    """
    e = activation_element_bytes(precision)
    d = 1 if shape.dropout > 0 else 0
    t = tp
    sbh = micro_batch * seq_local * shape.hidden
    layer_input = e * sbh / (t if sequence_parallel else 1)
    if checkpointing == "full":
        return layer_input
    if checkpointing == "op":
        sb = micro_batch * seq_local
        matmuls = e * sb * op_saved_elements_per_token(shape, tp=t, sequence_parallel=sequence_parallel)
        if attention == "eager":
            attn = e * shape.heads * seq_local * seq_local * micro_batch / t
        else:
            attn = 4.0 * shape.heads * seq_local * micro_batch / t
        return layer_input + matmuls + e * sbh / t + attn
    r = shape.kv_heads / shape.heads
    f_over_h = shape.ffn_hidden / shape.hidden
    replicated = (4 * e + 2 * d) * sbh
    split = e * (2 + 2 * r) * sbh + (4 * e if shape.mlp == "swiglu" else 2 * e) * f_over_h * sbh
    if attention == "eager":
        core = float((e + d + e * d) * shape.heads * seq_local * seq_local * micro_batch)
        if checkpointing == "selective":
            core = 0.0
    else:
        core = 4.0 * shape.heads * seq_local * micro_batch
    return replicated / (t if sequence_parallel else 1) + (split + core) / t


def in_flight_micro_batches(layout: Layout) -> float:
    """Micro-batches whose activations the first pipeline stage holds at its peak."""
    m, p, v = layout.grad_accum_steps, layout.pp, layout.virtual_stages
    if p == 1:
        return 1.0
    if layout.pipeline_schedule == "gpipe":
        return float(m)
    held = float(min(p, m))
    if layout.pipeline_schedule == "interleaved":
        held *= 1 + (p - 1) / (p * v)
    return held


def logits_bytes(shape: ModelShape, *, micro_batch: int, seq_local: int, tp: int,
                 precision: Precision) -> float:
    """Last stage: final-norm and output-layer inputs (2e sbh/t), the logits (e), their fp32 copy for
    the loss (4) and the fp32 gradient of the logits in backward (4), all sbV/t (vocab-parallel loss)."""
    e = activation_element_bytes(precision)
    sb = micro_batch * seq_local
    return (2 * e * sb * shape.hidden + (e + 8) * sb * shape.vocab) / tp


def runtime_overhead_bytes(cluster: Cluster, layout: Layout) -> float:
    """CUDA context and library workspaces, plus one set of NCCL buffers per communicator.

    Communicators: the default group, and each of dp, tp, pp, cp with more than one rank (HSDP
    has a shard group and a replicate group).
    """
    groups = 1
    groups += sum(1 for size in (layout.tp, layout.pp, layout.cp) if size > 1)
    if layout.dp * layout.cp > 1:
        groups += 1
    if layout.sharding == "hsdp":
        groups += 1
    gpu = cluster.gpu
    return (gpu.runtime_base_gib + gpu.communicator_gib * groups) * GIB


@dataclass(frozen=True, slots=True)
class Memory:
    params: float
    grads: float
    optimizer: float
    activations: float
    logits: float
    comm_buffers: float
    runtime_overhead: float
    allocator_margin: float
    cpu_per_node: float
    total: float


@dataclass(frozen=True, slots=True)
class StaticMemory:
    """The part of the breakdown that does not depend on micro-batch, schedule or checkpointing."""

    stages: StageParams
    first: ModelStates
    last: ModelStates
    overhead: float
    cpu_per_node_first: float
    cpu_per_node_last: float
    first_tensors: float
    last_tensors: float

    @property
    def floor(self) -> float:
        """A lower bound of the total: states, their buffers and the runtime, with the margin."""
        return max(self.first_tensors, self.last_tensors) * (1 + ALLOCATOR_MARGIN) + self.overhead


def static_memory(shape: ModelShape, cluster: Cluster, layout: Layout, *, precision: Precision,
                  optimizer: Optimizer) -> StaticMemory:
    stages = stage_params(shape, layout)
    first = model_state_bytes(stages.first, stages.largest_unit, layout, precision, optimizer)
    last = model_state_bytes(stages.last, stages.largest_unit, layout, precision, optimizer)
    per_node = min(cluster.gpus_per_node, cluster.world_size)

    def cpu(states: ModelStates) -> float:
        return (states.cpu_bytes + HOST_PROCESS_BYTES) * per_node if states.cpu_bytes else 0.0

    def tensors(s: ModelStates) -> float:
        return s.params + s.grads + s.optimizer + s.comm_buffers

    return StaticMemory(stages=stages, first=first, last=last, overhead=runtime_overhead_bytes(cluster, layout),
                        cpu_per_node_first=cpu(first), cpu_per_node_last=cpu(last),
                        first_tensors=tensors(first), last_tensors=tensors(last))


@dataclass(frozen=True, slots=True)
class ActivationMemory:
    """Activation and logits bytes of the first and the last stage; independent of sharding and offload."""

    first: float
    last: float
    logits: float


def activation_memory(shape: ModelShape, layout: Layout, *, precision: Precision,
                      attention: str) -> ActivationMemory:
    seq_local = shape.seq_len // layout.cp
    b = layout.micro_batch
    layers = layers_per_stage(shape, layout.pp)

    def layer_bytes(checkpointing: str) -> float:
        return layer_activation_bytes(
            shape, micro_batch=b, seq_local=seq_local, tp=layout.tp,
            sequence_parallel=layout.sequence_parallel, checkpointing=checkpointing,
            attention=attention, precision=precision)

    per_layer = layer_bytes(layout.activation_checkpointing)
    held = in_flight_micro_batches(layout)
    sp_div = layout.tp if layout.sequence_parallel else 1
    embed_extra = 8 * b * seq_local + (b * seq_local * shape.hidden / sp_div if shape.dropout > 0 else 0)
    first = held * (layers * per_layer + embed_extra)
    last = layers * per_layer * (1.0 if layout.pp > 1 else held)
    if layout.activation_checkpointing in ("full", "op"):
        # Backward rebuilds one layer at a time: what the mode dropped of it.
        rebuilt = max(0.0, layer_bytes("none") - (per_layer if layout.activation_checkpointing == "op" else 0.0))
        first += rebuilt
        last += rebuilt
    logits = logits_bytes(shape, micro_batch=b, seq_local=seq_local, tp=layout.tp, precision=precision)
    return ActivationMemory(first=first, last=last, logits=logits)


def combined_total(static: StaticMemory, acts: ActivationMemory, pp: int) -> float:
    """`combine(...).total` without building the breakdown (the search's hot path)."""
    scale = 1 + ALLOCATOR_MARGIN
    if pp == 1:
        return (static.first_tensors + acts.first + acts.logits) * scale + static.overhead
    first = static.first_tensors + acts.first
    last = static.last_tensors + acts.last + acts.logits
    return max(first, last) * scale + static.overhead


def combine(static: StaticMemory, acts: ActivationMemory, pp: int) -> Memory:
    """The breakdown of the most loaded rank from its two independent halves."""

    def build(states: ModelStates, cpu: float, act: float, logit: float) -> Memory:
        tensors = states.params + states.grads + states.optimizer + act + logit + states.comm_buffers
        margin = ALLOCATOR_MARGIN * tensors
        return Memory(params=states.params, grads=states.grads, optimizer=states.optimizer,
                      activations=act, logits=logit, comm_buffers=states.comm_buffers,
                      runtime_overhead=static.overhead, allocator_margin=margin, cpu_per_node=cpu,
                      total=tensors + margin + static.overhead)

    if pp == 1:
        return build(static.first, static.cpu_per_node_first, acts.first, acts.logits)
    first = build(static.first, static.cpu_per_node_first, acts.first, 0.0)
    last = build(static.last, static.cpu_per_node_last, acts.last, acts.logits)
    return first if first.total >= last.total else last


def memory(shape: ModelShape, cluster: Cluster, layout: Layout, *, precision: Precision,
           optimizer: Optimizer, attention: str) -> Memory:
    """The per-GPU breakdown on the most loaded rank (the larger of the first and last stage)."""
    static = static_memory(shape, cluster, layout, precision=precision, optimizer=optimizer)
    acts = activation_memory(shape, layout, precision=precision, attention=attention)
    return combine(static, acts, layout.pp)
