"""Apply a plan's layout to a model and its optimizer: the one place that knows how.

`apply_plan` is the public entry (`from workers.runtime import apply_plan`); the reference trainer
uses it too. What each layout field becomes:

- sharding ddp: `DistributedDataParallel` on the dp group (`gradient_as_bucket_view=True`).
- sharding zero1: DDP + `ZeroRedundancyOptimizer` (optimizer state split over dp).
- sharding zero2: FSDP2 `fully_shard` per block and on the root, `reshard_after_forward=False`.
- sharding zero3 / fsdp: FSDP2 `fully_shard` per block and on the root.
- sharding hsdp: FSDP2 on the 2-D mesh (`dp_replicate`, `dp_shard`).
- tp, sequence_parallel: DTensor `parallelize_module`: q/k/v, w1/w3 column-wise, o/w2 row-wise,
  embedding row-wise, output column-wise; SP shards norms and the residual stream on the sequence.
- pp, pipeline_schedule, virtual_stages: `torch.distributed.pipelining`, layers split evenly over the
  stages (`stage_layers`), GPipe, 1F1B or interleaved 1F1B, `grad_accum_steps` micro-batches.
- activation_checkpointing: `selective` checkpoints the attention core of each block, `full` each
  block, `op` each block with op-level selective checkpointing (`op_checkpointing`: torchtitan's
  policy), all with non-reentrant `torch.utils.checkpoint`.
- precision: fp32 nothing; bf16 FSDP2 `MixedPrecisionPolicy` (params bf16, reduce per
  `plan.precision.reduce`) where FSDP2 wrapped the model, else autocast; fp16 the same plus a
  gradient scaler (`ShardedGradScaler` under FSDP2, else `torch.amp.GradScaler`). Parameters,
  gradients and optimizer state stay fp32. All of it works on CPU with torch 2.13.
- grad_accum_steps: micro-steps per optimizer step. DDP syncs only on the last (`no_sync`). FSDP2
  reduce-scatters every micro-step and accumulates sharded gradients, as torchtitan does: deferring
  the sync (`set_requires_gradient_sync(False)`) would keep an unsharded fp32 gradient of every
  parameter until the last micro-step, memory the planner does not count without a pipeline (and
  its time model charges one reduce-scatter per micro-batch). HSDP defers only the all-reduce
  across replicas (`set_requires_all_reduce`). Pipelines accumulate inside the schedule.

Everything it cannot apply raises `UnsupportedLayout` naming the field, before any training.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.distributed.pipelining.schedules import (
    PipelineScheduleMulti,
    PipelineScheduleSingle,
    ScheduleInterleaved1F1B,
)
from torch.distributed.pipelining.stage import _PipelineStageBase
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.nn.parallel import DistributedDataParallel

from service.planner import Layout, Plan
from service.planner.models import ModelShape
from service.planner.runnable import runtime_problems
from workers.runtime.errors import UnsupportedLayout
from workers.runtime.mesh import Mesh
from workers.runtime.model import Block, Decoder, keep_stage
from workers.runtime.op_checkpointing import op_checkpoint_context

OptimizerFactory = Callable[[list[nn.Parameter]], torch.optim.Optimizer]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
FSDP_SHARDINGS = frozenset({"zero2", "zero3", "fsdp", "hsdp"})
DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy, computed in fp32."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def check_supported(layout: Layout, precision: str, device: torch.device, shape: ModelShape | None = None,
                    attention: str = "flash") -> None:
    """Raise `UnsupportedLayout` for what the runtime cannot apply (checked before building anything).

    The rules live in `service.planner.runnable` (no torch), which the planner's search uses too:
    the first problem `runtime_problems` finds is raised, naming the field and the fix.
    """
    problems = runtime_problems(layout, precision=precision, attention=attention, shape=shape)
    if problems:
        raise UnsupportedLayout(problems[0].field, problems[0].message)


@dataclass
class Applied:
    """A model and optimizer wrapped per a plan, with the training step that respects the layout.

    `parts` are the local model modules (one per pipeline stage this rank holds; one without
    pipelining), already wrapped (DDP/FSDP/TP). `train_step` runs one optimizer step over this
    rank's slice of the global batch and returns the mean micro-batch loss this rank saw (None
    on pipeline stages without the loss).
    """

    parts: list[nn.Module]
    optimizer: torch.optim.Optimizer
    mesh: Mesh
    layout: Layout
    device: torch.device
    precision: str
    loss_fn: LossFn = cross_entropy
    scaler: Any = None
    schedule: PipelineScheduleSingle | PipelineScheduleMulti | None = None
    has_first_stage: bool = True
    has_last_stage: bool = True
    _hooks: list[Any] = field(default_factory=list)
    _fsdp: bool = field(init=False, default=False)
    _autocast_dtype: torch.dtype | None = field(init=False, default=None)

    @property
    def model(self) -> nn.Module:
        """The (only) wrapped model; with several pipeline chunks on this rank, the first."""
        return self.parts[0]

    def parameters(self) -> Iterator[nn.Parameter]:
        for part in self.parts:
            yield from part.parameters()

    def __post_init__(self) -> None:
        # Decided once, not per step. FSDP2 casts parameters itself (MixedPrecisionPolicy); every
        # part that FSDP2 did not wrap (DDP, zero1, and an FSDP sharding with dp == 1, e.g. TP or
        # PP alone) needs autocast, or a bf16/fp16 plan would silently train in fp32.
        self._fsdp = any(isinstance(p, FSDPModule) for p in self.parts)
        self._autocast_dtype = (DTYPES[self.precision]
                                if self.precision in ("bf16", "fp16") and not self._fsdp else None)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """Autocast where FSDP2 does not do the casting (see `__post_init__`), else a no-op."""
        if self._autocast_dtype is not None:
            return torch.autocast(self.device.type, dtype=self._autocast_dtype)
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def _sync(self, sync: bool) -> Iterator[None]:
        """Cross-replica gradient sync only when `sync` (the last micro-step of an accumulation);
        FSDP2's reduce-scatter runs on every micro-step (see the module docstring)."""
        contexts: list[contextlib.AbstractContextManager[Any]] = []
        for part in self.parts:
            if isinstance(part, DistributedDataParallel) and not sync:
                contexts.append(part.no_sync())
            elif isinstance(part, FSDPModule) and self.layout.sharding == "hsdp":
                part.set_requires_all_reduce(sync)
        with contextlib.ExitStack() as stack:
            for c in contexts:
                stack.enter_context(c)
            yield

    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> float | None:
        """One optimizer step on this data-parallel rank's batch, (micro_batch*grad_accum_steps, seq).

        Gradients are zeroed at the start (so they can be measured after the step), synchronised
        only on the last micro-step, and the optimizer steps once.
        """
        self.optimizer.zero_grad(set_to_none=True)
        if self.schedule is not None:
            return self._pipeline_step(inputs, targets)
        accum = self.layout.grad_accum_steps
        if accum == 1:
            # The common case, kept as lean as a hand-written loop: no chunking, no loss scaling
            # by 1/accum, no sync toggling (gradients sync by default).
            with self.autocast():
                loss = self.loss_fn(self.model(inputs), targets)
            (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
            self._optimizer_step()
            return float(loss.detach())
        xs, ys = inputs.chunk(accum), targets.chunk(accum)
        total = torch.zeros((), device=self.device)
        for k in range(accum):
            with self._sync(k == accum - 1):
                with self.autocast():
                    loss = self.loss_fn(self.model(xs[k]), ys[k]) / accum
                (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
            total += loss.detach()
        self._optimizer_step()
        return float(total)

    def _pipeline_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> float | None:
        assert self.schedule is not None
        losses: list[torch.Tensor] = []
        args = (inputs,) if self.has_first_stage else ()
        with self.autocast():
            if self.has_last_stage:
                self.schedule.step(*args, target=targets, losses=losses)
            else:
                self.schedule.step(*args)
        self._optimizer_step()
        if not self.has_last_stage:
            return None
        return float(torch.stack([x.detach().float() for x in losses]).mean())

    def _optimizer_step(self) -> None:
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()


def _tp_plan(sp: bool) -> tuple[dict[str, ParallelStyle], dict[str, ParallelStyle]]:
    """Per-block and root TP plans for the reference decoder."""
    seq = Shard(1)
    block: dict[str, ParallelStyle] = {
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=seq) if sp else RowwiseParallel(),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w3": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=seq) if sp else RowwiseParallel(),
    }
    if sp:
        block.update({
            "attention_norm": SequenceParallel(),
            "ffn_norm": SequenceParallel(),
            "attention": PrepareModuleInput(input_layouts=(seq, None, None),
                                            desired_input_layouts=(Replicate(), None, None)),
            "feed_forward": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),)),
        })
    root: dict[str, ParallelStyle] = {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=seq if sp else Replicate()),
        "output": ColwiseParallel(input_layouts=seq if sp else Replicate(), output_layouts=Replicate()),
    }
    if sp:
        root["norm"] = SequenceParallel()
    return block, root


def apply_tp(model: Decoder, mesh: Mesh, sp: bool) -> None:
    """Tensor (and sequence) parallelism over the `tp` mesh dimension, in place."""
    tp_mesh = mesh.sub("tp")
    block_plan, root_plan = _tp_plan(sp)
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, block_plan)
    root = {k: v for k, v in root_plan.items() if getattr(model, k) is not None}
    if root:
        parallelize_module(model, tp_mesh, root)
    if model.tok_embeddings is not None:
        # A row-wise embedding's weight gradient comes back Replicate (full size); bring it to the
        # parameter's Shard(0) placement as soon as it is accumulated, so at rest it is a shard.
        weight = model.tok_embeddings.weight
        assert isinstance(weight, DTensor)

        def to_param_placement(p: torch.Tensor) -> None:
            g = p.grad
            if isinstance(g, DTensor) and isinstance(p, DTensor) and g.placements != p.placements:
                p.grad = g.redistribute(p.device_mesh, p.placements)

        weight.register_post_accumulate_grad_hook(to_param_placement)  # type: ignore[no-untyped-call]


def apply_checkpointing(model: nn.Module, mode: str) -> None:
    """selective: checkpoint the attention core of every block; full: every block; op: every block
    with torchtitan's op-level policy (`op_checkpointing`: matmul and attention outputs kept)."""
    for module in model.modules():
        if isinstance(module, Block):
            if mode in ("full", "op"):
                module.checkpoint_block = True
                module.checkpoint_context = op_checkpoint_context if mode == "op" else None
            elif mode == "selective":
                module.attention.checkpoint_core = True


def default_blocks(model: nn.Module) -> list[nn.Module]:
    """The units FSDP shards one by one: `Block`s, else the children of a `layers` container."""
    blocks: list[nn.Module] = [m for m in model.modules() if isinstance(m, Block)]
    if blocks:
        return blocks
    layers = getattr(model, "layers", None)
    if isinstance(layers, nn.ModuleList | nn.ModuleDict):
        return list(layers.children())
    return []


def apply_data_parallel(model: nn.Module, mesh: Mesh, layout: Layout, plan: Plan, device: torch.device,
                        blocks: list[nn.Module]) -> nn.Module:
    """DDP on the dp group, or FSDP2 per block and on the root over the (HSDP: 2-D) dp mesh."""
    if layout.sharding in FSDP_SHARDINGS:
        names = ("dp_replicate", "dp_shard") if layout.sharding == "hsdp" else ("dp",)
        if not all(n in mesh.sizes for n in names):
            return model  # dp == 1: nothing to shard over
        dp_mesh = mesh.sub(*names)
        precision = plan.precision.compute
        mp = MixedPrecisionPolicy()
        if precision in ("bf16", "fp16"):
            mp = MixedPrecisionPolicy(param_dtype=DTYPES[precision],
                                      reduce_dtype=DTYPES.get(plan.precision.reduce, torch.float32))
        reshard = layout.sharding != "zero2"
        for block in blocks:
            fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=mp)
        # The root (embedding, final norm, output layer) is used last in forward and first in
        # backward: resharding it in between only buys one more all-gather per step (the root is
        # gathered again at once and stays so until its post-backward at the end). FSDP2's default
        # for a root is therefore False; under pipelining several micro-batches' forwards sit
        # between, so it keeps the layout's resharding there.
        fully_shard(model, mesh=dp_mesh, reshard_after_forward=reshard and layout.pp > 1, mp_policy=mp)
        return model
    if not mesh.has("dp"):
        return model
    ids = [device.index] if device.type == "cuda" else None
    # Under a pipeline schedule several forwards run before the first (synced) backward, and DDP's
    # first-iteration bucket rebuild then records every parameter twice and fails an internal
    # assert (reducer.cpp "rebuilt parameter indices size is not same"). find_unused_parameters
    # turns the rebuild off; it costs one graph traversal per backward.
    # The reference decoder's only buffers are its constant rotary tables: broadcasting them from
    # rank 0 before every forward (DDP's default) is one collective per step for nothing. Other
    # models keep the default, since their buffers may be state (e.g. BatchNorm statistics).
    return DistributedDataParallel(model, device_ids=ids, process_group=mesh.group("dp"),
                                   gradient_as_bucket_view=True, find_unused_parameters=layout.pp > 1,
                                   forward_sync_buffers=not isinstance(model, Decoder))


def make_optimizer(params: list[nn.Parameter], name: str, lr: float, layout: Layout,
                   mesh: Mesh) -> torch.optim.Optimizer:
    """AdamW/Adam (betas 0.9/0.95, wd 0.1) or SGD with momentum; ZeRO-1 wraps it in ZeroRedundancyOptimizer."""
    kwargs: dict[str, Any] = {"lr": lr}
    cls: type[torch.optim.Optimizer]
    if name in ("adamw", "adam"):
        cls = torch.optim.AdamW if name == "adamw" else torch.optim.Adam
        kwargs.update(betas=(0.9, 0.95), weight_decay=0.1 if name == "adamw" else 0.0)
        # foreach kernels refuse lists that mix DTensor and plain tensors (TP without SP).
        kwargs["foreach"] = False if layout.tp > 1 else None
    elif name == "sgd":
        cls = torch.optim.SGD
        kwargs.update(momentum=0.9)
    else:
        raise UnsupportedLayout("optimizer", f"training.optimizer={name} is not implemented by the runtime")
    return _build_optimizer(cls, params, kwargs, layout, mesh)


def _build_optimizer(cls: type[torch.optim.Optimizer], params: list[nn.Parameter], kwargs: dict[str, Any],
                     layout: Layout, mesh: Mesh) -> torch.optim.Optimizer:
    """`cls(params, **kwargs)`, wrapped in ZeroRedundancyOptimizer under ZeRO-1 with a dp group."""
    if layout.sharding == "zero1" and mesh.has("dp"):
        return ZeroRedundancyOptimizer(params, optimizer_class=cls, process_group=mesh.group("dp"), **kwargs)
    return cls(params, **kwargs)


def _make_scaler(precision: str, parts: list[nn.Module], device: torch.device) -> Any:
    """fp16's loss scaler: `ShardedGradScaler` when FSDP2 wrapped the model, else `torch.amp.GradScaler`."""
    if precision != "fp16":
        return None
    if any(isinstance(p, FSDPModule) for p in parts):
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(device=device.type)
    return torch.amp.GradScaler(device.type)


def apply_plan(model: nn.Module, plan: Plan, mesh: Mesh, *, device: torch.device,
               optimizer: OptimizerFactory | torch.optim.Optimizer | None = None,
               optimizer_name: str = "adamw", lr: float = 1e-3,
               loss_fn: LossFn = cross_entropy) -> Applied:
    """Wrap `model` (on CPU or `device`, identical on every rank) and build its optimizer per `plan`.

    - `model`: the built-in `Decoder` supports every implemented layout; any other module supports
      ddp/zero1/zero2/zero3/fsdp/hsdp, checkpointing is then the user's business, and FSDP shards
      each `Block` or each child of a `model.layers` container plus the root.
      Tensor and pipeline parallelism need the reference `Decoder` (UnsupportedLayout otherwise).
    - `optimizer`: a factory `params -> Optimizer`, or an optimizer built on the unwrapped model
      (it is rebuilt from its class and `defaults`, since sharding replaces the parameters), or
      None for `optimizer_name` at `lr`.
    - `mesh`: from `workers.runtime.mesh.build_mesh(plan.layout, device)`.
    Returns an `Applied` whose `train_step` runs one optimizer step with the planned micro-batches.
    """
    layout = plan.layout
    precision = plan.precision.compute
    check_supported(layout, precision, device, plan.shape,
                    plan.training.attention if plan.training is not None else "flash")
    is_decoder = isinstance(model, Decoder)
    if not is_decoder and layout.tp > 1:
        raise UnsupportedLayout("tp", "tensor parallelism needs the reference Decoder (or your own TP plan)")
    if not is_decoder and layout.pp > 1:
        raise UnsupportedLayout("pp", "pipeline parallelism needs the reference Decoder (or your own stage split)")

    stage_ids = [0]
    if layout.pp > 1:
        v = layout.virtual_stages if layout.pipeline_schedule == "interleaved" else 1
        stage_ids = [mesh.coord("pp") + k * layout.pp for k in range(v)]
        total = layout.pp * v
        parts: list[nn.Module] = []
        for sid in stage_ids:
            part = copy.deepcopy(model) if len(stage_ids) > 1 else model
            keep_stage(cast(Decoder, part), sid, total)
            parts.append(part)
    else:
        total = 1
        parts = [model]

    wrapped: list[nn.Module] = []
    for part in parts:
        part.to(device)
        if layout.tp > 1:
            apply_tp(cast(Decoder, part), mesh, layout.sequence_parallel)
        if layout.activation_checkpointing != "none":
            apply_checkpointing(part, layout.activation_checkpointing)
        wrapped.append(apply_data_parallel(part, mesh, layout, plan, device, default_blocks(part)))

    params = [p for part in wrapped for p in part.parameters()]
    if isinstance(optimizer, torch.optim.Optimizer):
        cls, defaults = type(optimizer), dict(optimizer.defaults)
        opt: torch.optim.Optimizer = _build_optimizer(cls, params, defaults, layout, mesh)
    elif optimizer is not None:
        opt = optimizer(params)
    else:
        opt = make_optimizer(params, optimizer_name, lr, layout, mesh)

    applied = Applied(parts=wrapped, optimizer=opt, mesh=mesh, layout=layout, device=device, precision=precision,
                      loss_fn=loss_fn, scaler=_make_scaler(precision, wrapped, device))
    if layout.pp > 1:
        group = mesh.group("pp")
        stages: list[_PipelineStageBase] = [PipelineStage(part, sid, total, device, group=group)
                                            for part, sid in zip(wrapped, stage_ids, strict=True)]
        m = layout.grad_accum_steps
        if layout.pipeline_schedule == "interleaved":
            applied.schedule = ScheduleInterleaved1F1B(stages, n_microbatches=m, loss_fn=loss_fn)
        elif layout.pipeline_schedule == "gpipe":
            applied.schedule = ScheduleGPipe(stages[0], n_microbatches=m, loss_fn=loss_fn)
        else:
            applied.schedule = Schedule1F1B(stages[0], n_microbatches=m, loss_fn=loss_fn)
        applied.has_first_stage = 0 in stage_ids
        applied.has_last_stage = total - 1 in stage_ids
    return applied
