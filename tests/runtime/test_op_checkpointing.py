"""Op-level selective activation checkpointing (`activation_checkpointing: op`) in the runtime.

What it keeps is measured, not assumed: a dispatch mode records a weak reference to the storage of
every tensor the forward creates, and after the forward the storages still alive (parameters and
buffers excluded) are what the step holds for backward. Saved-tensor hooks cannot measure this: the
checkpoint installs its own hooks inside each block, and the selective policy's cache of saved op
outputs is not an autograd saved tensor at all. The difference between a 4-layer and a 2-layer model
is two layers' worth, which the planner's `layer_activation_bytes` must match.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

from service.planner.memory import layer_activation_bytes
from service.planner.models import ModelShape, resolve_model
from service.spec import ModelSpec
from tests.runtime.harness import TINY_MODEL, check_run, layout, make_case, torchrun
from tests.runtime.reference import reference_losses
from workers.runtime.model import Decoder
from workers.runtime.parallelize import apply_checkpointing, cross_entropy

BATCH = 2


class _Storages(TorchDispatchMode):
    """Weak references to the storage of every tensor an op returns while active."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: list[tuple[StorageWeakRef, int, int]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor):
                s = t.untyped_storage()
                self.refs.append((StorageWeakRef(s), s.nbytes(), s.data_ptr()))
        return out

    def live_bytes(self, exclude: set[int]) -> int:
        live = {ref.cdata: n for ref, n, ptr in self.refs if not ref.expired() and ptr not in exclude}
        return sum(live.values())


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.mm = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.ops.aten.mm.default:
            self.mm += 1
        return func(*args, **(kwargs or {}))


def _shape(layers: int) -> ModelShape:
    return resolve_model(ModelSpec.model_validate({**TINY_MODEL, "layers": layers}))


def _model(layers: int, mode: str) -> Decoder:
    torch.manual_seed(0)
    model = Decoder(_shape(layers))
    if mode != "none":
        apply_checkpointing(model, mode)
    return model


def _tokens(shape: ModelShape, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, shape.vocab, (BATCH, shape.seq_len + 1), generator=g)


def _held_for_backward(layers: int, mode: str) -> int:
    model = _model(layers, mode)
    tokens = _tokens(model.cfg)
    tracker = _Storages()
    with tracker:
        loss = cross_entropy(model(tokens[:, :-1]), tokens[:, 1:])
    own = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    held = tracker.live_bytes(own)
    loss.backward()
    return held


@pytest.fixture(scope="module")
def per_layer() -> dict[str, float]:
    torch.set_num_threads(1)
    return {m: (_held_for_backward(4, m) - _held_for_backward(2, m)) / 2 for m in ("none", "op", "full")}


def test_op_keeps_fewer_bytes_than_none_and_more_than_full(per_layer: dict[str, float]) -> None:
    assert per_layer["none"] > per_layer["op"] > per_layer["full"] > 0


@pytest.mark.parametrize("mode", ["op", "full"])
def test_the_planner_predicts_the_bytes_the_runtime_keeps_per_layer(per_layer: dict[str, float], mode: str) -> None:
    # fp32, flash (SDPA): op keeps x, q, v, w1, w2, the attention output and its log-sum-exp.
    predicted = layer_activation_bytes(_shape(4), micro_batch=BATCH, seq_local=TINY_MODEL["seq_len"], tp=1,
                                       sequence_parallel=False, checkpointing=mode, attention="flash",
                                       precision="fp32")
    assert per_layer[mode] == predicted


def _train(mode: str, steps: int = 3) -> tuple[list[float], list[torch.Tensor]]:
    model = _model(2, mode)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for step in range(steps):
        tokens = _tokens(model.cfg, seed=step)
        opt.zero_grad()
        loss = cross_entropy(model(tokens[:, :-1]), tokens[:, 1:])
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses, [p.detach().clone() for p in model.parameters()]


def test_op_trains_exactly_like_no_checkpointing() -> None:
    torch.set_num_threads(1)
    none_losses, none_params = _train("none")
    op_losses, op_params = _train("op")
    assert op_losses == pytest.approx(none_losses, abs=1e-6)
    for a, b in zip(op_params, none_params, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_op_backward_recomputes_every_second_matmul_of_each_block() -> None:
    # 7 matmuls per block: op replays k, o and w3 (3 per block); full replays all but w2, whose
    # output no gradient needs (the checkpoint stops its replay early).
    def backward_mm(mode: str) -> int:
        model = _model(2, mode)
        tokens = _tokens(model.cfg)
        loss = cross_entropy(model(tokens[:, :-1]), tokens[:, 1:])
        ops = _Ops()
        with ops:
            loss.backward()
        return ops.mm

    assert backward_mm("op") - backward_mm("none") == 3 * 2
    assert backward_mm("full") - backward_mm("none") == 6 * 2


@pytest.mark.parametrize("lay", [
    pytest.param(layout(sharding="fsdp", dp=2, micro_batch=2, accum=2, ac="op"), id="fsdp2-accum-op"),
    pytest.param(layout(sharding="fsdp", tp=2, sp=True, micro_batch=8, ac="op"), id="tp2-sp-op"),
])
def test_op_runs_multi_process_with_the_single_process_losses(tmp_path: Path, lay: Any) -> None:
    case = make_case(tmp_path, lay, steps=4)
    done = torchrun(case, "--no-profile", timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    check_run(case, lay, reference_losses(4, lay.dp * lay.micro_batch * lay.grad_accum_steps))
