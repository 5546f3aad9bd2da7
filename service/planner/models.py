"""Model presets and parameter counting.

`resolve_model` turns a `ModelSpec` (a preset, explicit fields, or both) into a `ModelShape`: the
full architecture plus exact parameter counts per part. Counting follows the modules a PyTorch
implementation creates: attention (q, k, v, o with grouped-query k/v), the MLP (SwiGLU has three
matrices, GeLU two), norms (RMSNorm one vector, LayerNorm two), optional biases, the token
embedding, an optional learned position embedding, the final norm and the output layer (absent
when tied to the embedding).

When the spec gives `params`, every counted part is scaled by `params / counted`, so model-state
memory uses the user's total while the split between layers, embedding and output keeps the
architecture's proportions.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from service.planner.errors import FieldProblem, InvalidSpec
from service.spec import ModelSpec

_LLAMA2 = {"vocab": 32000, "seq_len": 4096, "mlp": "swiglu", "norm": "rmsnorm", "dropout": 0.0,
           "tied_embeddings": False, "positional": "rope", "bias": False}
_LLAMA3 = {**_LLAMA2, "vocab": 128256, "seq_len": 8192}
_GPT = {"mlp": "gelu", "norm": "layernorm", "dropout": 0.1, "tied_embeddings": True,
        "positional": "learned", "bias": True, "vocab": 50257, "seq_len": 2048}

PRESETS: dict[str, dict[str, object]] = {
    "gpt3-175b": {**_GPT, "layers": 96, "hidden": 12288, "heads": 96, "ffn_hidden": 49152},
    # Narayanan et al. 2021, Table 1: the 1T-parameter GPT (128 layers, h = 25600, 160 heads).
    "gpt-1t": {**_GPT, "layers": 128, "hidden": 25600, "heads": 160, "ffn_hidden": 102400, "vocab": 51200},
    "llama-2-7b": {**_LLAMA2, "layers": 32, "hidden": 4096, "heads": 32, "ffn_hidden": 11008},
    "llama-2-13b": {**_LLAMA2, "layers": 40, "hidden": 5120, "heads": 40, "ffn_hidden": 13824},
    "llama-2-70b": {**_LLAMA2, "layers": 80, "hidden": 8192, "heads": 64, "kv_heads": 8,
                    "ffn_hidden": 28672},
    "llama-3.1-8b": {**_LLAMA3, "layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8,
                     "ffn_hidden": 14336},
    "llama-3.1-70b": {**_LLAMA3, "layers": 80, "hidden": 8192, "heads": 64, "kv_heads": 8,
                      "ffn_hidden": 28672},
    "llama-3.1-405b": {**_LLAMA3, "layers": 126, "hidden": 16384, "heads": 128, "kv_heads": 8,
                       "ffn_hidden": 53248},
    # A few million parameters: for CPU demos and tests of the runtime.
    "llama-tiny": {**_LLAMA2, "layers": 4, "hidden": 256, "heads": 8, "kv_heads": 4, "ffn_hidden": 688,
                   "vocab": 4096, "seq_len": 256},
}

_REQUIRED = ("layers", "hidden", "heads", "vocab", "seq_len")


class Architecture(BaseModel):
    """The shape of a decoder-only transformer, every field resolved."""

    model_config = ConfigDict(frozen=True)

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn_hidden: int
    vocab: int
    seq_len: int
    mlp: Literal["swiglu", "gelu"] = "swiglu"
    norm: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    dropout: float = 0.0
    tied_embeddings: bool = False
    positional: Literal["rope", "learned"] = "rope"
    bias: bool = False


class ModelShape(Architecture):
    """An architecture with exact parameter counts (elements, not bytes)."""

    name: str
    # Parameter counts, already scaled to the spec's `params` when it gives one.
    layer_matmul_params: float
    layer_norm_params: float
    embedding_params: float
    output_params: float
    final_norm_params: float

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_hidden(self) -> int:
        """Width of K (and of V): kv_heads x head_dim."""
        return self.kv_heads * self.head_dim

    @property
    def layer_params(self) -> float:
        return self.layer_matmul_params + self.layer_norm_params

    @property
    def total_params(self) -> float:
        return (self.layers * self.layer_params + self.embedding_params + self.output_params
                + self.final_norm_params)

    @property
    def matmul_params(self) -> float:
        """Parameters that take part in a matmul per token: every layer plus the output layer.

        The token embedding is a lookup; with tied embeddings its matrix is still the output layer.
        """
        head = self.vocab * self.hidden if self.tied_embeddings else self.output_params
        return self.layers * self.layer_matmul_params + head


def count_parameters(arch: Architecture) -> dict[str, float]:
    """Exact element counts of each part of a decoder-only transformer."""
    h = arch.hidden
    kv_hidden = arch.kv_heads * (h // arch.heads)
    attention = 2 * h * h + 2 * h * kv_hidden
    mlp_matrices = 3 if arch.mlp == "swiglu" else 2
    mlp_params = mlp_matrices * h * arch.ffn_hidden
    if arch.bias:
        attention += 2 * h + 2 * kv_hidden
        mlp_params += (mlp_matrices - 1) * arch.ffn_hidden + h
    per_norm = h if arch.norm == "rmsnorm" else 2 * h
    embedding = arch.vocab * h + (arch.seq_len * h if arch.positional == "learned" else 0)
    return {
        "layer_matmul_params": float(attention + mlp_params),
        "layer_norm_params": float(2 * per_norm),
        "embedding_params": float(embedding),
        "output_params": 0.0 if arch.tied_embeddings else float(arch.vocab * h),
        "final_norm_params": float(per_norm),
    }


def resolve_model(spec: ModelSpec) -> ModelShape:
    """Merge preset and explicit fields, check the shape, count parameters."""
    fields: dict[str, object] = {}
    name = spec.preset or "custom"
    if spec.preset is not None:
        preset = PRESETS.get(spec.preset) or PRESETS.get(spec.preset.lower())
        if preset is None:
            raise InvalidSpec([FieldProblem(
                loc=("model", "preset"),
                message=f"unknown preset {spec.preset!r}; use one of {', '.join(PRESETS)}"
                " or give the architecture fields",
            )])
        fields.update(preset)
    fields.update(spec.model_dump(exclude_none=True, exclude={"preset", "params"}))
    missing = [f for f in _REQUIRED if f not in fields]
    if missing:
        raise InvalidSpec([FieldProblem(
            loc=("model", m),
            message="required: give a preset or the architecture (layers, hidden, heads, vocab, seq_len);"
            " params alone sizes model states but activations and FLOPs need the shape",
        ) for m in missing])
    fields.setdefault("kv_heads", fields["heads"])
    if "ffn_hidden" not in fields:
        # Conventional widths: 4h for GeLU; 8h/3 rounded up to a multiple of 256 for SwiGLU.
        hidden = fields["hidden"]
        assert isinstance(hidden, int)
        fields["ffn_hidden"] = 4 * hidden if fields.get("mlp") == "gelu" else -(-(8 * hidden // 3) // 256) * 256
    arch = Architecture.model_validate(fields)
    problems = []
    if arch.hidden % arch.heads:
        problems.append(FieldProblem(
            loc=("model", "hidden"), message=f"hidden ({arch.hidden}) must be divisible by heads ({arch.heads})"))
    if arch.heads % arch.kv_heads:
        problems.append(FieldProblem(
            loc=("model", "kv_heads"),
            message=f"heads ({arch.heads}) must be a multiple of kv_heads ({arch.kv_heads})"))
    if problems:
        raise InvalidSpec(problems)
    counts = count_parameters(arch)
    counted = (arch.layers * (counts["layer_matmul_params"] + counts["layer_norm_params"])
               + counts["embedding_params"] + counts["output_params"] + counts["final_norm_params"])
    if spec.params is not None:
        scale = spec.params / counted
        if not 0.5 <= scale <= 2.0:
            raise InvalidSpec([FieldProblem(
                loc=("model", "params"),
                message=f"params ({spec.params:.4g}) is far from what the architecture counts"
                f" ({counted:.4g}); fix the shape or drop params",
            )])
        counts = {k: v * scale for k, v in counts.items()}
    return ModelShape.model_validate({**arch.model_dump(), "name": name, **counts})
