"""The matmuls of one transformer layer in forward order, and which of them op-level selective
activation checkpointing keeps (`activation_checkpointing: op`).

The policy is torchtitan's (`selective_ac_option = "op"`, `_save_list` and the policy in
`torchtitan/distributed/activation_checkpoint.py`); the runtime applies it to each block with
`torch.utils.checkpoint.checkpoint(..., use_reentrant=False, context_fn=...)`
(`workers.runtime.op_checkpointing`):

- the outputs of the linear layers' matmuls (aten.mm, aten.addmm) are saved, except every second one
  in the block's forward order (the 2nd, 4th, ...), which backward recomputes: torchtitan's trade
  between memory and recompute;
- attention's outputs are saved (SDPA: the output and the fp32 log-sum-exp; eager attention's
  aten.bmm: the scores and the context), and so is the sequence-parallel reduce-scatter's output;
- everything else (norms, RoPE, the MLP activation and product, residual adds, all-gathers) is
  recomputed in backward from the block's input, which the checkpoint keeps.

The reference decoder's block runs q, k, v, o, w1 (gate), w3 (up), w2 (down): q, v, w1 and w2 are
saved, k, o and w3 recomputed. A GELU MLP runs fc1, fc2: q, v and fc1 are saved.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.planner.models import ModelShape


@dataclass(frozen=True, slots=True)
class Matmul:
    """One linear layer: `k` input and `n` output features (the full model's, before tensor
    parallelism). Column-parallel ones split `n` across TP; row-parallel ones split `k`, so their
    local output is a full-width partial sum that TP then reduces."""

    name: str
    k: int
    n: int
    row_parallel: bool

    @property
    def params(self) -> int:
        return self.k * self.n


def layer_matmuls(shape: ModelShape) -> tuple[Matmul, ...]:
    """The layer's linear layers in the order its forward runs them."""
    h, kv, f = shape.hidden, shape.kv_hidden, shape.ffn_hidden
    attention = (Matmul("q", h, h, False), Matmul("k", h, kv, False), Matmul("v", h, kv, False),
                 Matmul("o", h, h, True))
    if shape.mlp == "swiglu":
        mlp: tuple[Matmul, ...] = (Matmul("w1", h, f, False), Matmul("w3", h, f, False), Matmul("w2", f, h, True))
    else:
        mlp = (Matmul("fc1", h, f, False), Matmul("fc2", f, h, True))
    return attention + mlp


def op_saved(shape: ModelShape) -> tuple[Matmul, ...]:
    """The matmuls whose outputs `op` checkpointing keeps: the 1st, 3rd, 5th... in forward order."""
    return layer_matmuls(shape)[::2]


def op_recomputed_share(shape: ModelShape) -> float:
    """The share of the layer's matmul FLOPs that `op` checkpointing recomputes (the 2nd, 4th, ...
    matmuls): 0.39 for Llama-2-7B, whose recomputed k, o and w3 hold 2h^2 + hf of 4h^2 + 3hf."""
    mms = layer_matmuls(shape)
    return sum(m.params for m in mms[1::2]) / sum(m.params for m in mms)


def op_saved_elements_per_token(shape: ModelShape, *, tp: int, sequence_parallel: bool) -> float:
    """Elements per token (of one sequence position, one micro-batch row) of the saved matmul
    outputs on one TP rank: column-parallel outputs are split by tp, a row-parallel output is the
    full-width partial sum before its reduction; with sequence parallelism the reduce-scatter that
    follows every row-parallel matmul keeps its (split) output too."""
    out = 0.0
    for m in op_saved(shape):
        out += m.n if m.row_parallel and tp > 1 else m.n / tp
    if sequence_parallel and tp > 1:
        out += sum(m.n for m in layer_matmuls(shape) if m.row_parallel) / tp
    return out


__all__ = ["Matmul", "layer_matmuls", "op_recomputed_share", "op_saved", "op_saved_elements_per_token"]
