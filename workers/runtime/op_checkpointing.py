"""Op-level selective activation checkpointing (`activation_checkpointing: op`): torchtitan's policy.

`op_checkpoint_context` is the `context_fn` that `Block` hands to
`torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`. Within one block's forward it saves
the outputs of

- the linear layers' matmuls (aten.mm, aten.addmm), except every second one in forward order
  (counted separately in the forward and in the recompute, as torchtitan does), which is recomputed;
- attention: SDPA's kernels (flash, memory-efficient, cuDNN, CPU flash: output and log-sum-exp)
  and aten.bmm (eager attention's scores and context);
- the sequence-parallel reduce-scatter (a collective replayed in backward would cost a second one);

and recomputes everything else in backward. `service.planner.layer_matmuls` models the same policy;
tests/runtime/test_op_checkpointing.py checks the planner's bytes against what this keeps.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
from torch.utils.checkpoint import CheckpointPolicy, SelectiveCheckpointContext, create_selective_checkpoint_contexts

_aten = torch.ops.aten
MATMULS: frozenset[Any] = frozenset({_aten.mm.default, _aten.addmm.default})
_SAVED_NAMES = (
    (_aten, "bmm"),
    (_aten, "_scaled_dot_product_flash_attention"),
    (_aten, "_scaled_dot_product_efficient_attention"),
    (_aten, "_scaled_dot_product_cudnn_attention"),
    (_aten, "_scaled_dot_product_flash_attention_for_cpu"),
    (torch.ops._c10d_functional, "reduce_scatter_tensor"),
)
#: Saved whenever they run (the ones this build of torch has).
ALWAYS_SAVED: frozenset[Any] = frozenset(
    getattr(ns, name).default for ns, name in _SAVED_NAMES if hasattr(ns, name))


def op_policy() -> Any:
    """A fresh policy for one checkpointed block: MUST_SAVE for the ops listed in the module doc."""
    matmuls_seen: dict[bool, int] = defaultdict(int)

    def policy(ctx: SelectiveCheckpointContext, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        if func in MATMULS:
            matmuls_seen[ctx.is_recompute] += 1
            odd = matmuls_seen[ctx.is_recompute] % 2 == 1
            return CheckpointPolicy.MUST_SAVE if odd else CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if func in ALWAYS_SAVED else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def op_checkpoint_context() -> tuple[Any, Any]:
    """The `context_fn` for `torch.utils.checkpoint.checkpoint`: a new policy per block and call."""
    contexts: tuple[Any, Any] = create_selective_checkpoint_contexts(op_policy())  # type: ignore[no-untyped-call]
    return contexts


__all__ = ["ALWAYS_SAVED", "MATMULS", "op_checkpoint_context", "op_policy"]
