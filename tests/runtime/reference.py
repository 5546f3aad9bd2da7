"""The single-process fp32 reference: the same model, data and optimizer, no wrapping at all."""

from __future__ import annotations

import torch

from service.planner.models import resolve_model
from service.spec import ModelSpec
from tests.runtime.harness import TINY_MODEL
from workers.runtime.data import global_batch
from workers.runtime.model import Decoder
from workers.runtime.parallelize import cross_entropy


def reference_losses(steps: int, batch: int, *, seed: int = 1234, lr: float = 1e-3) -> list[float]:
    """Loss of each step of plain single-process training on the whole global batch."""
    torch.set_num_threads(1)
    shape = resolve_model(ModelSpec.model_validate(TINY_MODEL))
    torch.manual_seed(seed)
    model = Decoder(shape)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    losses = []
    for step in range(steps):
        tokens = global_batch(seed, step, batch, shape.seq_len, shape.vocab)
        opt.zero_grad()
        loss = cross_entropy(model(tokens[:, :-1]), tokens[:, 1:])
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses
