"""Synthetic tokens: seeded, identical for every layout, learnable.

Step `s` of a run with seed `seed` has one global batch of `global_batch` sequences of
`seq_len + 1` tokens, generated from `(seed, s)` alone, so any layout (and a resumed attempt)
sees exactly the same data. Each token follows its predecessor by `t -> (7 t + 3) mod vocab`
with probability 3/4 and is uniform otherwise: a model can learn it, so the loss falls within a
few steps and a wrong gradient shows up in the loss curve.
"""

from __future__ import annotations

import torch


def global_batch(seed: int, step: int, batch: int, seq_len: int, vocab: int) -> torch.Tensor:
    """(batch, seq_len + 1) int64 tokens for `step`."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    noise = torch.randint(0, vocab, (batch, seq_len + 1), generator=gen)
    follow = torch.rand((batch, seq_len + 1), generator=gen) < 0.75
    tokens = noise.clone()
    for i in range(1, seq_len + 1):
        nxt = (tokens[:, i - 1] * 7 + 3) % vocab
        tokens[:, i] = torch.where(follow[:, i], nxt, noise[:, i])
    return tokens


def local_batch(seed: int, step: int, batch: int, seq_len: int, vocab: int, dp: int,
                dp_rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This data-parallel rank's contiguous slice of the global batch: (inputs, targets)."""
    if batch % dp:
        raise ValueError(f"training.global_batch ({batch}) must be divisible by dp ({dp})")
    tokens = global_batch(seed, step, batch, seq_len, vocab)
    per = batch // dp
    mine = tokens[dp_rank * per:(dp_rank + 1) * per]
    return mine[:, :-1].contiguous(), mine[:, 1:].contiguous()
