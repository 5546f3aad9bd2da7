"""The training spec: the one input contract shared by the API, the CLI and the planner.

`TrainingSpec` checks everything that can be checked from the spec alone (types, ranges, enums,
fields that contradict each other). Checks that need the model preset or the GPU catalog (heads
divisible by tp, a GPU name that exists) happen in `service.planner.resolve`, which reports them
in the same shape: a field path and a message that says what is allowed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from service.backend_options import BackendKind, BackendOptions, LocalOptions
from service.names import JobName, Label

Precision = Literal["fp32", "bf16", "fp16", "fp8"]
Optimizer = Literal["adamw", "adam", "sgd", "adam8bit"]
Checkpointing = Literal["none", "selective", "full"]
Attention = Literal["flash", "eager"]
Sharding = Literal["ddp", "zero1", "zero2", "zero3", "fsdp", "hsdp"]
PipelineSchedule = Literal["gpipe", "1f1b", "interleaved"]
Offload = Literal["none", "optimizer", "params"]

PositiveInt = Annotated[int, Field(gt=0)]
PositiveFloat = Annotated[float, Field(gt=0)]


class _Strict(BaseModel):
    """Unknown keys are errors: a typo in a spec must not be silently ignored."""

    model_config = ConfigDict(extra="forbid")


class ModelSpec(_Strict):
    """The model: a preset, explicit architecture fields, or both (explicit fields override)."""

    preset: str | None = Field(None, description="Known model, e.g. llama-3.1-8b; see `shardctl plan --help`.")
    params: PositiveFloat | None = Field(
        None, description="Total parameters. Scales the counted architecture; sizes model-state memory."
    )
    layers: PositiveInt | None = None
    hidden: PositiveInt | None = None
    heads: PositiveInt | None = None
    kv_heads: PositiveInt | None = Field(None, description="Key/value heads (GQA); defaults to heads.")
    ffn_hidden: PositiveInt | None = None
    vocab: PositiveInt | None = None
    seq_len: PositiveInt | None = None
    mlp: Literal["swiglu", "gelu"] | None = None
    norm: Literal["rmsnorm", "layernorm"] | None = None
    dropout: Annotated[float, Field(ge=0.0, lt=1.0)] | None = None
    tied_embeddings: bool | None = None
    positional: Literal["rope", "learned"] | None = Field(
        None, description="rope adds no parameters; learned adds seq_len x hidden."
    )
    bias: bool | None = Field(None, description="Linear layers carry biases (GPT-2/3 style).")

    @model_validator(mode="after")
    def _shape_is_consistent(self) -> ModelSpec:
        if self.hidden is not None and self.heads is not None and self.hidden % self.heads:
            raise ValueError(
                f"model.hidden ({self.hidden}) must be divisible by model.heads ({self.heads})"
            )
        if self.heads is not None and self.kv_heads is not None and self.heads % self.kv_heads:
            raise ValueError(
                f"model.heads ({self.heads}) must be a multiple of model.kv_heads ({self.kv_heads})"
            )
        return self


class TrainingConfig(_Strict):
    global_batch: PositiveInt = Field(description="Sequences per optimizer step.")
    precision: Precision = "bf16"
    optimizer: Optimizer = "adamw"
    activation_checkpointing: Literal["auto", "none", "selective", "full"] = "auto"
    attention: Attention = "flash"
    steps: PositiveInt = 100


class GpuOverride(_Strict):
    """A GPU given inline: a catalog name whose fields are overridden, or a new GPU."""

    name: str
    memory_gib: PositiveFloat | None = None
    peak_tflops: dict[Precision, PositiveFloat] | None = Field(
        None, description="Dense (not with-sparsity) peak TFLOP/s per precision."
    )
    hbm_gbps: PositiveFloat | None = Field(None, description="Memory bandwidth, GB/s.")


class Resources(_Strict):
    gpu: str | GpuOverride = Field(description="A catalog name or an inline GPU.")
    gpus_per_node: PositiveInt = 8
    nodes: PositiveInt | None = None
    gpus: PositiveInt | None = Field(None, description="Total GPUs; an alternative to nodes.")
    intra_node_gbps: PositiveFloat | None = Field(None, description="Per-GPU unidirectional GB/s in a node.")
    inter_node_gbps: PositiveFloat | None = Field(None, description="Per-GPU GB/s across nodes.")
    cpu_memory_gib: PositiveFloat | None = Field(None, description="Host RAM per node, for offload.")

    @model_validator(mode="after")
    def _count_is_given_once(self) -> Resources:
        if self.nodes is not None and self.gpus is not None and self.nodes * self.gpus_per_node != self.gpus:
            raise ValueError(
                f"resources: nodes ({self.nodes}) x gpus_per_node ({self.gpus_per_node}) != gpus ({self.gpus});"
                " give either nodes or gpus"
            )
        if self.gpus is not None and self.gpus > self.gpus_per_node and self.gpus % self.gpus_per_node:
            raise ValueError(
                f"resources.gpus ({self.gpus}) must be a multiple of gpus_per_node ({self.gpus_per_node})"
                " when it spans several nodes"
            )
        return self

    @property
    def world_size(self) -> int:
        """Total GPUs (or worker processes on `cpu`)."""
        if self.gpus is not None:
            return self.gpus
        return (self.nodes or 1) * self.gpus_per_node

    @property
    def node_count(self) -> int:
        if self.gpus is not None:
            return max(1, -(-self.gpus // self.gpus_per_node))
        return self.nodes or 1

    @property
    def gpu_name(self) -> str:
        return self.gpu if isinstance(self.gpu, str) else self.gpu.name


class LayoutPins(_Strict):
    """Optional pins; the planner searches whatever is left unset."""

    dp: PositiveInt | None = None
    tp: PositiveInt | None = None
    pp: PositiveInt | None = None
    cp: PositiveInt | None = None
    sharding: Sharding | None = None
    dp_shard: PositiveInt | None = Field(None, description="HSDP: size of the sharding group (default: one node).")
    sequence_parallel: bool | None = None
    micro_batch: PositiveInt | None = None
    activation_checkpointing: Checkpointing | None = None
    pipeline_schedule: PipelineSchedule | None = None
    virtual_stages: PositiveInt | None = None
    offload: Offload | None = None

    @model_validator(mode="after")
    def _pins_agree(self) -> LayoutPins:
        if self.sequence_parallel and self.tp == 1:
            raise ValueError("layout.sequence_parallel needs layout.tp > 1 (it shards along the TP group)")
        if self.virtual_stages not in (None, 1) and self.pipeline_schedule not in (None, "interleaved"):
            raise ValueError("layout.virtual_stages > 1 needs layout.pipeline_schedule: interleaved")
        if self.offload == "params" and self.sharding in ("ddp", "zero1", "zero2"):
            raise ValueError(
                "layout.offload: params needs fully sharded parameters (sharding zero3, fsdp or hsdp)"
            )
        if self.offload == "optimizer" and self.sharding == "ddp":
            raise ValueError("layout.offload: optimizer needs a ZeRO/FSDP sharding (zero1 or higher), not ddp")
        if self.dp_shard is not None and self.sharding not in (None, "hsdp"):
            raise ValueError("layout.dp_shard applies only to sharding: hsdp")
        return self


class EntrypointSpec(_Strict):
    """A user's own program, run under torchrun on every node. Absent: the built-in reference trainer."""

    command: list[str] = Field(min_length=1)
    image: str | None = Field(None, description="Container image (Kubernetes; Slurm with a container runtime).")
    env: dict[str, str] = Field(default_factory=dict)


class TrainingSpec(_Strict):
    """What a user asks for. `layout` pins are optional; everything unpinned is searched."""

    name: JobName
    model: ModelSpec
    training: TrainingConfig
    resources: Resources
    layout: LayoutPins = Field(default_factory=LayoutPins)
    team: Label | None = Field(None, description="Owning team; a member's token implies it.")
    priority: int = Field(0, ge=-1000, le=1000, description="Higher runs first within a team's quota.")
    backend: BackendOptions = Field(default_factory=LocalOptions,
                                    description="Where the job runs: {kind: local|slurm|kubernetes, ...options}.")
    entrypoint: EntrypointSpec | None = None

    @model_validator(mode="after")
    def _checkpointing_pinned_once(self) -> TrainingSpec:
        wanted = self.training.activation_checkpointing
        pinned = self.layout.activation_checkpointing
        if wanted != "auto" and pinned is not None and pinned != wanted:
            raise ValueError(
                f"training.activation_checkpointing ({wanted}) contradicts layout.activation_checkpointing"
                f" ({pinned}); set one of them"
            )
        return self

    @property
    def checkpointing_pin(self) -> Checkpointing | None:
        """The checkpointing mode the user fixed, if any (`auto` leaves it to the search)."""
        if self.layout.activation_checkpointing is not None:
            return self.layout.activation_checkpointing
        wanted = self.training.activation_checkpointing
        return None if wanted == "auto" else wanted


def field_path(loc: tuple[int | str, ...]) -> str:
    """A pydantic error location as the dotted path a user writes in the spec: `backend.sbatch`, not
    the union's internal `backend.slurm.sbatch`."""
    parts = list(loc)
    if len(parts) > 1 and parts[0] == "backend" and parts[1] in {k.value for k in BackendKind}:
        del parts[1]
    return ".".join(str(p) for p in parts)


def parse_spec_text(text: str, *, source: str = "<spec>") -> TrainingSpec:
    """Parse YAML or JSON text (JSON is YAML) into a validated spec.

    Raises `ValueError` for text that is not a mapping and `pydantic.ValidationError` for a spec
    that breaks the contract.
    """
    try:
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"{source}: not valid YAML or JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{source}: a spec must be a mapping with name, model, training and resources")
    return TrainingSpec.model_validate(data)


def load_spec(path: Path) -> TrainingSpec:
    """Load a `.yaml`, `.yml` or `.json` spec file."""
    return parse_spec_text(path.read_text(encoding="utf-8"), source=str(path))


def spec_json_schema() -> dict[str, Any]:
    """The JSON Schema of `TrainingSpec`, as `shardctl spec-schema` prints it."""
    return TrainingSpec.model_json_schema()


__all__ = [
    "BackendOptions",
    "EntrypointSpec",
    "GpuOverride",
    "LayoutPins",
    "ModelSpec",
    "Resources",
    "TrainingConfig",
    "TrainingSpec",
    "field_path",
    "load_spec",
    "parse_spec_text",
    "spec_json_schema",
]
