"""The plan: the output contract of the planner (bytes, seconds, integers; no rendering)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from service.planner.layout import Layout
from service.planner.models import ModelShape
from service.spec import TrainingConfig


class MemoryBreakdown(BaseModel):
    """Bytes per GPU on the most loaded rank."""

    params: int
    grads: int
    optimizer: int
    activations: int = Field(description="Transformer layers only.")
    logits: int = Field(description="Output-layer input, logits and loss buffers (last stage).")
    comm_buffers: int = Field(description="DDP gradient buckets, FSDP gathered units and reduce buffers.")
    runtime_overhead: int = Field(description="CUDA context, workspaces, NCCL buffers per communicator.")
    allocator_margin: int = Field(description="Caching-allocator reserve over allocated bytes.")
    total: int
    gpu_memory: int = Field(description="What one rank may use (for `cpu`: its share of the node's RAM).")
    fits: bool
    cpu_memory: int | None = Field(None, description="Host bytes per node when offloading.")
    cpu_memory_available: int | None = None


class StepEstimate(BaseModel):
    compute_s: float
    recompute_s: float
    comm_exposed_s: float
    bubble_s: float
    optimizer_s: float
    offload_s: float
    step_s: float
    tokens_per_step: int
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    model_flops_per_step: float
    hardware_flops_per_step: float = Field(description="Model FLOPs plus recompute.")
    mfu: float
    flop_convention: str
    peak_flops_per_gpu: float
    job_s: float = Field(description="step_s x training.steps.")

    @property
    def exposed_comm_fraction(self) -> float | None:
        """The share of a step spent in communication that compute does not hide (0-1), which a
        profile's measured exposed communication is compared with; None for a zero-length step."""
        return min(self.comm_exposed_s / self.step_s, 1.0) if self.step_s > 0 else None


class CommVolumes(BaseModel):
    """Bytes each GPU sends per optimizer step, by group."""

    dp: int
    tp: int
    pp: int
    cp: int
    offload: int = Field(0, description="Host <-> device bytes over PCIe.")


class PrecisionPolicy(BaseModel):
    compute: str
    params: str
    grads: str
    reduce: str
    loss_scaler: bool = Field(description="fp16 needs a dynamic loss scaler; bf16 and fp32 do not.")


class Alternative(BaseModel):
    """A runner-up layout and why it loses to the chosen one."""

    layout: Layout
    fits: bool
    memory_total: int
    step_s: float
    tokens_per_s: float
    mfu: float
    why_not: str


class Rejected(BaseModel):
    """How many candidate layouts were turned down, by reason."""

    invalid: int = 0
    out_of_memory: int = 0
    dominated: int = Field(0, description="Skipped: a faster variant of the same layout already fits.")
    slower: int = Field(0, description="Fit but were not chosen (slower, less headroom, less simple, or needing"
                        " a runtime gap), or were skipped because compute alone is slower than 1.25x the best.")


class CalibrationUse(BaseModel):
    """Whether and how measurements of earlier runs corrected this plan (docs/planner.md, "Calibration").

    When `used`, the plan's `time` and ranking include `step_factor` and its fit was decided on
    `memory_total` (the model's allocated bytes, `memory.total` less `memory.runtime_overhead`, times
    `memory_factor`, plus that overhead); `memory` stays the model's breakdown."""

    used: bool
    gpu: str
    family: str = Field(description="The chosen layout's family, e.g. `fsdp+tp`.")
    runs: int = Field(description="Measured runs of this GPU kind and family.")
    min_runs: int = Field(description="Runs a factor needs before it is used.")
    step_factor: float = Field(description="Applied to the step time (1.0: not applied).")
    memory_factor: float = Field(description="Applied to the per-GPU allocated bytes, not the runtime's fixed"
                                 " overhead (1.0: not applied).")
    model_step_s: float = Field(description="The model's step time before calibration.")
    memory_total: int = Field(description="Calibrated bytes per GPU: (memory.total - memory.runtime_overhead) x"
                              " memory_factor + memory.runtime_overhead.")
    families: int = Field(0, description="Families of this GPU kind with a factor in use (they re-ranked the search).")


class Plan(BaseModel):
    name: str
    fits: bool
    model: str
    model_params: int
    gpu: str
    world_size: int
    nodes: int
    gpus_per_node: int
    layout: Layout
    memory: MemoryBreakdown
    time: StepEstimate
    comm: CommVolumes
    precision: PrecisionPolicy
    rubric: str
    explanation: list[str]
    alternatives: list[Alternative]
    rejected: Rejected
    candidates_evaluated: int
    reasons: list[str] = Field(default_factory=list, description="Why nothing fits, when fits is false.")
    min_gpus_to_fit: int | None = Field(None, description="Smallest GPU count of this kind that fits.")
    warnings: list[str] = Field(default_factory=list)
    shape: ModelShape | None = Field(
        None, description="The resolved model: every dimension and exact parameter counts. With `training`,"
        " all a job needs to run this plan (None only in plans stored before plans carried it).")
    training: TrainingConfig | None = Field(
        None, description="The spec's training settings the plan was made for (batch, precision, optimizer, steps).")
    calibration: CalibrationUse | None = Field(
        None, description="Set when the plan was made with a calibration: whether it was used, the factors, the runs.")

    @property
    def runnable(self) -> bool:
        """The plan carries what the runtime needs to run it without the spec."""
        return self.shape is not None and self.training is not None
