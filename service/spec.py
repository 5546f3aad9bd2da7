"""The training spec: the one input contract shared by the API, the CLI and the planner.

`TrainingSpec` checks everything that can be checked from the spec alone (types, ranges, enums,
fields that contradict each other). Every number has a stated range (`RANGES`; each field's
description in the JSON Schema repeats it) and every float is finite: a NaN, an infinity, a 10^400
or a 5e-324 is a validation error naming the field and the range, never a planner crash or a
search that does not end. Checks that need the model preset or the GPU catalog (heads
divisible by tp, a GPU name that exists) happen in `service.planner.resolve`, which reports them
in the same shape: a field path and a message that says what is allowed.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from service.backend_options import BackendKind, BackendOptions, LocalOptions
from service.names import JobName, Label

Precision = Literal["fp32", "bf16", "fp16", "fp8"]
Optimizer = Literal["adamw", "adam", "sgd", "adam8bit"]
#: none: keep every activation; selective: recompute the attention core (Korthikanti et al. 2022);
#: op: PyTorch's op-level selective checkpointing with torchtitan's policy (keep matmul and attention
#: outputs, every second matmul and all else recomputed); full: keep only each layer's input.
Checkpointing = Literal["none", "selective", "op", "full"]
Attention = Literal["flash", "eager"]
Sharding = Literal["ddp", "zero1", "zero2", "zero3", "fsdp", "hsdp"]
PipelineSchedule = Literal["gpipe", "1f1b", "interleaved"]
Offload = Literal["none", "optimizer", "params"]

# Bounds: generous (well past any cluster or model built so far) but finite, so that every product
# the planner forms stays exact and the search stays bounded. `docs/planner.md` has the table.
MAX_GPUS = 1 << 20  # 1,048,576 GPUs in all
MAX_GPUS_PER_NODE = 64
MAX_BATCH = 1 << 24  # sequences per optimizer step (16,777,216)
MAX_SEQ_LEN = 1 << 24
MAX_LAYERS = 10_000
MAX_HIDDEN = 1 << 20
MAX_HEADS = 1 << 16
MAX_FFN_HIDDEN = 1 << 22
MAX_VOCAB = 1 << 24
MAX_STEPS = 10**9
MAX_PARAMS = 1e15
MAX_REPLANS = 10  # out-of-memory re-plans of one job (`recovery.max_replans`)
MAX_MEMORY_GIB = 1e5  # GPU memory or host RAM per node: 100,000 GiB
MAX_TFLOPS = 1e7
MAX_GBPS = 1e7
#: the least memory (GiB), peak (TFLOP/s) or bandwidth (GB/s) a spec may give: 5e-324 is not zero,
#: but dividing by it overflows
MIN_RATE = 1e-3


def _number(value: float) -> str:
    if isinstance(value, int) or (value.is_integer() and abs(value) < 1e9):
        return f"{int(value):,}"
    return f"{value:g}".replace("e+", "e")


def allowed_range(low: float, high: float) -> str:
    """`1 to 16,777,216`: the words every range error and field description use."""
    return f"{_number(low)} to {_number(high)}"


def _within(allowed: str) -> WrapValidator:
    """Adds the allowed range to whatever error the constrained number raises (type, finiteness, bounds)."""

    def check(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value)
        except ValidationError as exc:
            reason = str(exc.errors()[0]["msg"]).removeprefix("Value error, ")
            raise PydanticCustomError("number_out_of_range", "{reason}; allowed: {allowed}",
                                      {"reason": reason, "allowed": allowed}) from None

    return WrapValidator(check)


GpuCount = Annotated[int, Field(gt=0, le=MAX_GPUS), _within(allowed_range(1, MAX_GPUS))]
GpusPerNode = Annotated[int, Field(gt=0, le=MAX_GPUS_PER_NODE), _within(allowed_range(1, MAX_GPUS_PER_NODE))]
BatchSize = Annotated[int, Field(gt=0, le=MAX_BATCH), _within(allowed_range(1, MAX_BATCH))]
SeqLen = Annotated[int, Field(gt=0, le=MAX_SEQ_LEN), _within(allowed_range(1, MAX_SEQ_LEN))]
LayerCount = Annotated[int, Field(gt=0, le=MAX_LAYERS), _within(allowed_range(1, MAX_LAYERS))]
Hidden = Annotated[int, Field(gt=0, le=MAX_HIDDEN), _within(allowed_range(1, MAX_HIDDEN))]
Heads = Annotated[int, Field(gt=0, le=MAX_HEADS), _within(allowed_range(1, MAX_HEADS))]
FfnHidden = Annotated[int, Field(gt=0, le=MAX_FFN_HIDDEN), _within(allowed_range(1, MAX_FFN_HIDDEN))]
Vocab = Annotated[int, Field(gt=0, le=MAX_VOCAB), _within(allowed_range(1, MAX_VOCAB))]
Steps = Annotated[int, Field(gt=0, le=MAX_STEPS), _within(allowed_range(1, MAX_STEPS))]
ParamCount = Annotated[float, Field(ge=1, le=MAX_PARAMS, allow_inf_nan=False),
                       _within(allowed_range(1, MAX_PARAMS))]
MemoryGiB = Annotated[float, Field(ge=MIN_RATE, le=MAX_MEMORY_GIB, allow_inf_nan=False),
                      _within(allowed_range(MIN_RATE, MAX_MEMORY_GIB))]
Tflops = Annotated[float, Field(ge=MIN_RATE, le=MAX_TFLOPS, allow_inf_nan=False),
                   _within(allowed_range(MIN_RATE, MAX_TFLOPS))]
Gbps = Annotated[float, Field(ge=MIN_RATE, le=MAX_GBPS, allow_inf_nan=False),
                 _within(allowed_range(MIN_RATE, MAX_GBPS))]
Dropout = Annotated[float, Field(ge=0.0, lt=1.0, allow_inf_nan=False), _within("0 to 1 (1 excluded)")]
Priority = Annotated[int, Field(ge=-1000, le=1000), _within(allowed_range(-1000, 1000))]

#: field -> its allowed range, as the errors and the JSON Schema state it (docs/planner.md has the table)
RANGES: dict[str, str] = {
    "model.params": allowed_range(1, MAX_PARAMS),
    "model.layers": allowed_range(1, MAX_LAYERS),
    "model.hidden": allowed_range(1, MAX_HIDDEN),
    "model.heads": allowed_range(1, MAX_HEADS),
    "model.kv_heads": allowed_range(1, MAX_HEADS),
    "model.ffn_hidden": allowed_range(1, MAX_FFN_HIDDEN),
    "model.vocab": allowed_range(1, MAX_VOCAB),
    "model.seq_len": allowed_range(1, MAX_SEQ_LEN),
    "model.dropout": "0 to 1 (1 excluded)",
    "training.global_batch": allowed_range(1, MAX_BATCH),
    "training.steps": allowed_range(1, MAX_STEPS),
    "resources.gpu.memory_gib": allowed_range(MIN_RATE, MAX_MEMORY_GIB),
    "resources.gpu.peak_tflops.*": allowed_range(MIN_RATE, MAX_TFLOPS),
    "resources.gpu.hbm_gbps": allowed_range(MIN_RATE, MAX_GBPS),
    "resources.gpus_per_node": allowed_range(1, MAX_GPUS_PER_NODE),
    "resources.nodes": allowed_range(1, MAX_GPUS) + " (nodes x gpus_per_node at most 1,048,576)",
    "resources.gpus": allowed_range(1, MAX_GPUS),
    "resources.intra_node_gbps": allowed_range(MIN_RATE, MAX_GBPS),
    "resources.inter_node_gbps": allowed_range(MIN_RATE, MAX_GBPS),
    "resources.cpu_memory_gib": allowed_range(MIN_RATE, MAX_MEMORY_GIB),
    "layout.dp": allowed_range(1, MAX_GPUS),
    "layout.tp": allowed_range(1, MAX_GPUS),
    "layout.pp": allowed_range(1, MAX_GPUS),
    "layout.cp": allowed_range(1, MAX_GPUS),
    "layout.dp_shard": allowed_range(1, MAX_GPUS),
    "layout.micro_batch": allowed_range(1, MAX_BATCH),
    "layout.virtual_stages": allowed_range(1, MAX_LAYERS),
    "priority": allowed_range(-1000, 1000),
    "recovery.max_replans": allowed_range(0, MAX_REPLANS),
    "planner.min_free_fraction": "0 to 0.5 (0.5 excluded), e.g. 0.1 to keep 10% of GPU memory free",
}


def _says(text: str, field: str) -> str:
    """A field description ending with the field's range."""
    return f"{text} {RANGES[field]}."


class _Strict(BaseModel):
    """Unknown keys are errors: a typo in a spec must not be silently ignored. Every float is finite
    (what the API stores must be JSON both databases can read back)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class ModelSpec(_Strict):
    """The model: a preset, explicit architecture fields, or both (explicit fields override)."""

    preset: str | None = Field(None, description="Known model, e.g. llama-3.1-8b; see `shardctl plan --help`.")
    params: ParamCount | None = Field(None, description=_says(
        "Total parameters. Scales the counted architecture; sizes model-state memory.", "model.params"))
    layers: LayerCount | None = Field(None, description=_says("Transformer layers:", "model.layers"))
    hidden: Hidden | None = Field(None, description=_says("Model width:", "model.hidden"))
    heads: Heads | None = Field(None, description=_says("Attention heads:", "model.heads"))
    kv_heads: Heads | None = Field(None, description=_says("Key/value heads (GQA); defaults to heads.",
                                                           "model.kv_heads"))
    ffn_hidden: FfnHidden | None = Field(None, description=_says("MLP width:", "model.ffn_hidden"))
    vocab: Vocab | None = Field(None, description=_says("Vocabulary size:", "model.vocab"))
    seq_len: SeqLen | None = Field(None, description=_says("Tokens per sequence:", "model.seq_len"))
    mlp: Literal["swiglu", "gelu"] | None = None
    norm: Literal["rmsnorm", "layernorm"] | None = None
    dropout: Dropout | None = Field(None, description=_says("Dropout probability:", "model.dropout"))
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
    global_batch: BatchSize = Field(description=_says("Sequences per optimizer step:", "training.global_batch"))
    precision: Precision = "bf16"
    optimizer: Optimizer = "adamw"
    activation_checkpointing: Literal["auto", "none", "selective", "op", "full"] = Field("auto", description=(
        "auto: the planner chooses; none; selective: recompute the attention core (Korthikanti et al.);"
        " op: op-level selective checkpointing, torchtitan's policy (keep matmul and attention outputs,"
        " recompute every second matmul and the rest); full: recompute each layer from its input"))
    attention: Attention = "flash"
    steps: Steps = Field(100, description=_says("Optimizer steps:", "training.steps"))


class GpuOverride(_Strict):
    """A GPU given inline: a catalog name whose fields are overridden, or a new GPU."""

    name: str
    memory_gib: MemoryGiB | None = Field(None, description=_says("Memory per GPU, GiB:", "resources.gpu.memory_gib"))
    peak_tflops: dict[Precision, Tflops] | None = Field(None, description=_says(
        "Dense (not with-sparsity) peak TFLOP/s per precision, each", "resources.gpu.peak_tflops.*"))
    hbm_gbps: Gbps | None = Field(None, description=_says("Memory bandwidth, GB/s:", "resources.gpu.hbm_gbps"))


def _gpu_kind(value: Any) -> str:
    return "inline" if isinstance(value, dict | GpuOverride) else "catalog"


#: A catalog name, or an inline GPU; tagged so that an error names `resources.gpu.memory_gib`, not
#: the union's members (`resources.gpu.str`, `resources.gpu.GpuOverride.memory_gib`).
GpuChoice = Annotated[
    Annotated[str, Tag("catalog")] | Annotated[GpuOverride, Tag("inline")],
    Discriminator(_gpu_kind),
]
#: Union tags pydantic puts in error locations, by the field they follow.
_UNION_TAGS = {"backend": {k.value for k in BackendKind}, "gpu": {"catalog", "inline"}}


class Resources(_Strict):
    gpu: GpuChoice = Field(description="A catalog name or an inline GPU.")
    gpus_per_node: GpusPerNode = Field(8, description=_says("GPUs (or worker processes) per node:",
                                                            "resources.gpus_per_node"))
    nodes: GpuCount | None = Field(None, description=_says("Nodes:", "resources.nodes"))
    gpus: GpuCount | None = Field(None, description=_says("Total GPUs; an alternative to nodes:", "resources.gpus"))
    intra_node_gbps: Gbps | None = Field(None, description=_says(
        "Per-GPU unidirectional GB/s in a node:", "resources.intra_node_gbps"))
    inter_node_gbps: Gbps | None = Field(None, description=_says(
        "Per-GPU GB/s across nodes:", "resources.inter_node_gbps"))
    cpu_memory_gib: MemoryGiB | None = Field(None, description=_says(
        "Host RAM per node, GiB, for offload:", "resources.cpu_memory_gib"))

    @model_validator(mode="after")
    def _count_is_given_once(self) -> Resources:
        if self.nodes is not None and self.nodes * self.gpus_per_node > MAX_GPUS:
            raise ValueError(
                f"resources: nodes ({self.nodes}) x gpus_per_node ({self.gpus_per_node}) ="
                f" {self.nodes * self.gpus_per_node:,} GPUs, more than the {MAX_GPUS:,} a spec may ask for"
            )
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

    dp: GpuCount | None = Field(None, description=_says("Data-parallel degree:", "layout.dp"))
    tp: GpuCount | None = Field(None, description=_says("Tensor-parallel degree:", "layout.tp"))
    pp: GpuCount | None = Field(None, description=_says("Pipeline stages:", "layout.pp"))
    cp: GpuCount | None = Field(None, description=_says("Context-parallel degree:", "layout.cp"))
    sharding: Sharding | None = None
    dp_shard: GpuCount | None = Field(None, description=_says(
        "HSDP: size of the sharding group (default: one node):", "layout.dp_shard"))
    sequence_parallel: bool | None = None
    micro_batch: BatchSize | None = Field(None, description=_says("Sequences per micro-batch:", "layout.micro_batch"))
    activation_checkpointing: Checkpointing | None = None
    pipeline_schedule: PipelineSchedule | None = None
    virtual_stages: LayerCount | None = Field(None, description=_says(
        "Interleaved schedule: model chunks per pipeline stage:", "layout.virtual_stages"))
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


#: An environment variable name every backend can set (Kubernetes' rule for `env[].name`, which POSIX
#: shells' names are a part of): a process environment cannot carry a name with `=` in it.
MAX_ENV_NAME = 255
ENV_NAME = re.compile(rf"[A-Za-z_.-][A-Za-z0-9_.-]{{0,{MAX_ENV_NAME - 1}}}")


class EntrypointSpec(_Strict):
    """A user's own program, run under torchrun on every node. Absent: the built-in reference trainer."""

    command: list[str] = Field(min_length=1)
    image: str | None = Field(None, description="Container image (Kubernetes; Slurm with a container runtime).")
    env: dict[str, str] = Field(default_factory=dict, description="Variables every rank gets. Write-only: the"
                                " API shows their names, never their values, unless named in public_env.")
    public_env: list[str] = Field(default_factory=list, max_length=256,
                                  description="Names in env whose values the API may show (e.g. MODE, LOG_LEVEL).")

    @field_validator("env")
    @classmethod
    def _names_and_values(cls, env: dict[str, str]) -> dict[str, str]:
        for name, value in env.items():
            if not ENV_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not an environment variable name: use letters, digits, '_', '.'"
                                 " and '-', not starting with a digit (no '=', space or control character),"
                                 f" at most {MAX_ENV_NAME} characters")
            if "\x00" in value:
                raise ValueError(f"the value of {name!r} holds a NUL character, which no environment can carry:"
                                 " remove it")
        return env

    @model_validator(mode="after")
    def _public_names_exist(self) -> EntrypointSpec:
        unknown = sorted(set(self.public_env) - set(self.env))
        if unknown:
            raise ValueError(f"entrypoint.public_env names {unknown}, which entrypoint.env does not set")
        return self


class RecoverySpec(_Strict):
    """What the dispatcher does when an attempt runs out of memory (`docs/failures.md`)."""

    replan_on_oom: bool = Field(False, description=(
        "After oom_gpu or oom_host, plan again with the memory model capped at what the failed attempt"
        " measured (smaller micro-batch, then activation checkpointing, more sharding, tensor or pipeline"
        " parallelism, offload; the global batch is kept) and run the new layout. Off: the job fails."))
    max_replans: Annotated[int, Field(ge=0, le=MAX_REPLANS), _within(allowed_range(0, MAX_REPLANS))] = Field(
        3, description="Re-plans after running out of memory, at most; they do not count against max_attempts."
        f" {allowed_range(0, MAX_REPLANS)}.")


MinFreeFraction = Annotated[float, Field(ge=0.0, lt=0.5, allow_inf_nan=False),
                            _within(RANGES["planner.min_free_fraction"])]


class PlannerOptions(_Strict):
    """How the planner ranks layouts that fit (`docs/planner.md`, risk-aware ranking)."""

    min_free_fraction: MinFreeFraction = Field(0.10, description=(
        "The least share of GPU memory a preferred layout leaves free (variable shapes, fragmentation):"
        " a layout that leaves less is chosen only when none leaving this much fits; 0 turns the rule off."
        f" {RANGES['planner.min_free_fraction']}."))


class TrainingSpec(_Strict):
    """What a user asks for. `layout` pins are optional; everything unpinned is searched."""

    name: JobName
    model: ModelSpec
    training: TrainingConfig
    resources: Resources
    layout: LayoutPins = Field(default_factory=LayoutPins)
    team: Label | None = Field(None, description="Owning team; a member's token implies it.")
    priority: Priority = Field(0, description=_says("Higher runs first within a team's quota:", "priority"))
    backend: BackendOptions = Field(default_factory=LocalOptions,
                                    description="Where the job runs: {kind: local|slurm|kubernetes, ...options}.")
    entrypoint: EntrypointSpec | None = None
    recovery: RecoverySpec = Field(default_factory=RecoverySpec,
                                   description="Out-of-memory recovery: {replan_on_oom: true, max_replans: 3}.")
    planner: PlannerOptions = Field(default_factory=PlannerOptions,
                                    description="Planner options: {min_free_fraction: 0.1}.")

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
    """A pydantic error location as the dotted path a user writes in the spec: `backend.sbatch` and
    `resources.gpu.memory_gib`, not the unions' internal `backend.slurm.sbatch` and
    `resources.gpu.inline.memory_gib`."""
    parts: list[int | str] = []
    for part in loc:
        if parts and part in _UNION_TAGS.get(str(parts[-1]), ()):
            continue
        parts.append(part)
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
    "MAX_BATCH",
    "MAX_GPUS",
    "MAX_GPUS_PER_NODE",
    "RANGES",
    "BackendOptions",
    "EntrypointSpec",
    "GpuOverride",
    "LayoutPins",
    "ModelSpec",
    "RecoverySpec",
    "Resources",
    "TrainingConfig",
    "TrainingSpec",
    "field_path",
    "load_spec",
    "parse_spec_text",
    "spec_json_schema",
]
