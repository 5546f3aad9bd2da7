"""The reference decoder: a Llama-style transformer (RMSNorm, rotary embeddings, GQA, SwiGLU).

Contract:
- Parameter names and counts match `service.planner.models.count_parameters` for an architecture
  with `norm: rmsnorm`, `mlp: swiglu`, `positional: rope`, `bias: false`, untied embeddings:
  per layer q, k, v, o (k and v are `kv_heads x head_dim` wide), w1/w3 (gate/up) and w2 (down),
  two RMSNorm vectors; then `tok_embeddings`, a final `norm` and an `output` layer.
- Layers live in a `ModuleDict` keyed by their global index, so a pipeline stage that keeps
  layers 2..3 still names them `layers.2`, `layers.3` (checkpoints stay stage-independent).
- Any of `tok_embeddings`, `norm`, `output` may be `None` (a pipeline stage without them);
  `forward` then takes hidden states instead of token ids, or returns hidden states.
- Attention infers its local head count from the projection width (`view(..., -1, head_dim)`),
  so tensor parallelism can split q/k/v column-wise without touching the module.
- Rotary tables are non-persistent buffers: not parameters, not in the state dict.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from service.planner.models import ModelShape

NORM_EPS = 1e-5
ROPE_THETA = 10000.0


def check_buildable(shape: ModelShape) -> None:
    """Raise ValueError naming every field of `shape` the reference decoder cannot build."""
    problems = []
    if shape.mlp != "swiglu":
        problems.append(f"model.mlp={shape.mlp} (the reference decoder is SwiGLU)")
    if shape.norm != "rmsnorm":
        problems.append(f"model.norm={shape.norm} (the reference decoder uses RMSNorm)")
    if shape.positional != "rope":
        problems.append(f"model.positional={shape.positional} (the reference decoder uses RoPE)")
    if shape.bias:
        problems.append("model.bias=true (the reference decoder has no biases)")
    if shape.tied_embeddings:
        problems.append("model.tied_embeddings=true (the reference decoder has an untied output layer)")
    if shape.dropout:
        problems.append(f"model.dropout={shape.dropout} (the reference decoder has no dropout)")
    if problems:
        raise ValueError("the built-in reference decoder cannot build this model: " + "; ".join(problems))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return out.type_as(x) * self.weight


def rope_tables(head_dim: int, seq_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables of shape (seq_len, head_dim // 2)."""
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), freqs)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[..., 2i], x[..., 2i+1]) of x: (batch, seq, heads, head_dim)."""
    xf = x.float().reshape(*x.shape[:-1], -1, 2)
    x1, x2 = xf[..., 0], xf[..., 1]
    c = cos[None, :, None, :]
    s = sin[None, :, None, :]
    out = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)
    return out.type_as(x)


def attention_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal scaled-dot-product attention on (batch, heads, seq, head_dim); k/v may have fewer heads."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])


class Attention(nn.Module):
    def __init__(self, cfg: ModelShape) -> None:
        super().__init__()
        self.head_dim = cfg.head_dim
        kv = cfg.kv_heads * cfg.head_dim
        self.wq = nn.Linear(cfg.hidden, cfg.hidden, bias=False)
        self.wk = nn.Linear(cfg.hidden, kv, bias=False)
        self.wv = nn.Linear(cfg.hidden, kv, bias=False)
        self.wo = nn.Linear(cfg.hidden, cfg.hidden, bias=False)
        self.checkpoint_core = False

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s = x.shape[0], x.shape[1]
        q = self.wq(x).view(b, s, -1, self.head_dim)
        k = self.wk(x).view(b, s, -1, self.head_dim)
        v = self.wv(x).view(b, s, -1, self.head_dim)
        q, k = apply_rope(q, cos[:s], sin[:s]), apply_rope(k, cos[:s], sin[:s])
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if self.checkpoint_core and torch.is_grad_enabled():
            out = checkpoint(attention_core, q, k, v, use_reentrant=False)
        else:
            out = attention_core(q, k, v)
        result: torch.Tensor = self.wo(out.transpose(1, 2).reshape(b, s, -1))
        return result


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelShape) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.hidden, cfg.ffn_hidden, bias=False)
        self.w2 = nn.Linear(cfg.ffn_hidden, cfg.hidden, bias=False)
        self.w3 = nn.Linear(cfg.hidden, cfg.ffn_hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result: torch.Tensor = self.w2(F.silu(self.w1(x)) * self.w3(x))
        return result


class Block(nn.Module):
    def __init__(self, cfg: ModelShape) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(cfg.hidden, NORM_EPS)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.hidden, NORM_EPS)
        self.feed_forward = FeedForward(cfg)
        self.checkpoint_block = False
        self.checkpoint_context: Callable[[], tuple[Any, Any]] | None = None  # e.g. op-level selective

    def _forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin)
        out: torch.Tensor = h + self.feed_forward(self.ffn_norm(h))
        return out

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if self.checkpoint_block and torch.is_grad_enabled():
            if self.checkpoint_context is not None:
                out: torch.Tensor = checkpoint(self._forward, x, cos, sin, use_reentrant=False,
                                               context_fn=self.checkpoint_context)
            else:
                out = checkpoint(self._forward, x, cos, sin, use_reentrant=False)
            return out
        return self._forward(x, cos, sin)


class Decoder(nn.Module):
    """The reference decoder. `forward(tokens)` returns logits (batch, seq, vocab) in the compute dtype."""

    def __init__(self, cfg: ModelShape) -> None:
        """Raises ValueError when `cfg` is not a shape the reference decoder builds (`check_buildable`)."""
        check_buildable(cfg)
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(cfg.vocab, cfg.hidden)
        self.layers = nn.ModuleDict({str(i): Block(cfg) for i in range(cfg.layers)})
        self.norm: RMSNorm | None = RMSNorm(cfg.hidden, NORM_EPS)
        self.output: nn.Linear | None = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        cos, sin = rope_tables(cfg.head_dim, cfg.seq_len, ROPE_THETA)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Deterministic given the torch seed: normal(0, 0.02) matrices, output scaled by depth."""
        std = 0.02
        for name, p in self.named_parameters():
            if p.dim() == 1:
                nn.init.ones_(p)
            elif name.endswith(("wo.weight", "w2.weight")):
                nn.init.normal_(p, std=std / math.sqrt(2 * self.cfg.layers))
            else:
                nn.init.normal_(p, std=std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(x) if self.tok_embeddings is not None else x
        cos = self.get_buffer("rope_cos")
        sin = self.get_buffer("rope_sin")
        for layer in self.layers.values():
            h = layer(h, cos, sin)
        if self.norm is not None:
            h = self.norm(h)
        if self.output is not None:
            h = self.output(h)
        return h


def stage_layers(layers: int, stage: int, stages: int) -> list[int]:
    """The consecutive layers stage `stage` of `stages` holds: as even as possible, the first
    `layers % stages` stages one more. The busiest stage has ceil(layers / stages), as the planner
    models it (`layers_per_stage`), and every stage has at least one while stages <= layers."""
    share, extra = divmod(layers, stages)
    start = stage * share + min(stage, extra)
    return list(range(start, start + share + (stage < extra)))


def keep_stage(model: Decoder, stage: int, stages: int) -> list[int]:
    """Turn `model` into pipeline stage `stage` of `stages`, in place; return the kept layer indices
    (`stage_layers`). The first stage keeps the embedding, the last the final norm and the output
    layer. Raises ValueError when there are more stages than layers.
    """
    kept = stage_layers(model.cfg.layers, stage, stages)
    if not kept:
        raise ValueError(f"layout.pp={stages}: {stages} pipeline stages for {model.cfg.layers} layers leave"
                         f" stage {stage} without one; use at most {model.cfg.layers} stages")
    for i in range(model.cfg.layers):
        if i not in kept:
            del model.layers[str(i)]
    if stage != 0:
        model.tok_embeddings = None
    if stage != stages - 1:
        model.norm = None
        model.output = None
    return kept
