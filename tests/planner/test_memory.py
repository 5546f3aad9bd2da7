"""Memory model against the ZeRO paper, Korthikanti et al. and the product brief's examples."""

from __future__ import annotations

import math

import pytest

from service.planner import estimate
from service.planner.hardware import GIB
from service.planner.memory import (
    activation_memory,
    layer_activation_bytes,
    logits_bytes,
    model_state_bytes,
    runtime_overhead_bytes,
)
from service.planner.models import resolve_model
from service.planner.search import resolve
from service.spec import ModelSpec
from tests.conftest import make_spec
from tests.support.planner import layout

GB = 1e9


def states_total(psi: float, **kw: object) -> float:
    s = model_state_bytes(psi, 0.0, layout(**kw), "bf16", "adamw")
    return s.params + s.grads + s.optimizer


# --- ZeRO (Rajbhandari et al. 2020), Sec. 5: 7.5B parameters, N_d = 64, K = 12 -------------------


def test_ddp_holds_the_zero_baseline_16_bytes_per_parameter() -> None:
    assert states_total(7.5e9, sharding="ddp", dp=64, dp_shard=1) == 120 * GB


def test_full_sharding_equals_zero3_16_psi_over_n() -> None:
    assert states_total(7.5e9, sharding="fsdp", dp=64, dp_shard=64) == pytest.approx(1.875 * GB)
    assert states_total(7.5e9, sharding="zero3", dp=64, dp_shard=64) == pytest.approx(1.875 * GB)


def test_pytorch_zero1_and_zero2_save_no_more_than_the_paper_stages() -> None:
    # PyTorch keeps fp32 master params and grads (ZeroRedundancyOptimizer shards only Adam's m, v;
    # FSDP2 keeps fp32 grads), so its ZeRO-1 can never beat the paper's P_os = 4Ψ + 12Ψ/N, while
    # its ZeRO-2 states (16Ψ/N) plus the unsharded bf16 params held through the step (2Ψ) match
    # the paper's P_os+g = 2Ψ + 14Ψ/N to within 2Ψ/N.
    psi, n = 7.5e9, 64
    zero1 = states_total(psi, sharding="zero1", dp=n, dp_shard=n)
    assert zero1 >= 4 * psi + 12 * psi / n
    assert zero1 == 8 * psi + 8 * psi / n
    s2 = model_state_bytes(psi, 0.0, layout(sharding="zero2", dp=n, dp_shard=n), "bf16", "adamw")
    held = s2.params + s2.grads + s2.optimizer + 2 * psi
    assert held - (2 * psi + 14 * psi / n) == pytest.approx(2 * psi / n)


@pytest.mark.parametrize(("optimizer", "k"), [("adamw", 12), ("sgd", 8), ("adam8bit", 6)])
def test_optimizer_bytes_follow_the_ztm101_k(optimizer: str, k: int) -> None:
    # Mixed precision: 2 + 2 + K bytes per parameter in ZeRO's accounting; the same total here.
    s = model_state_bytes(1e9, 0.0, layout(sharding="ddp", dp_shard=1), "bf16", optimizer)  # type: ignore[arg-type]
    assert s.params + s.grads + s.optimizer == (2 + 2 + k) * 1e9


# --- The product brief -----------------------------------------------------------------------


def _13b_on_8_a100(**pins: object):
    spec = make_spec(model={"preset": "llama-2-13b"}, training={"global_batch": 64},
                     resources={"gpu": "A100-SXM-80GB"})
    return spec, estimate(spec, layout(grad_accum_steps=8, **pins))


def test_13b_does_not_fit_under_ddp_at_208_gb_of_model_state() -> None:
    _, p = _13b_on_8_a100(sharding="ddp", dp_shard=1, activation_checkpointing="full")
    assert p.memory.params + p.memory.grads + p.memory.optimizer == pytest.approx(208 * GB, rel=0.002)
    assert not p.fits
    assert "more than" in p.reasons[0]


def test_13b_fits_fully_sharded_at_about_26_gb_of_model_state() -> None:
    _, p = _13b_on_8_a100(sharding="fsdp")
    assert p.fits
    assert p.memory.params + p.memory.grads + p.memory.optimizer == pytest.approx(26 * GB, rel=0.002)


def test_7b_needs_112_gb_of_model_state() -> None:
    spec = make_spec(model={"preset": "llama-2-7b", "params": 7e9}, resources={"gpu": "A100-SXM-80GB"})
    p = estimate(spec, layout(sharding="ddp", dp_shard=1))
    assert p.memory.params + p.memory.grads + p.memory.optimizer == pytest.approx(112 * GB)


def test_70b_does_not_fit_under_plain_ddp_on_eight_80gb_gpus() -> None:
    spec = make_spec(model={"preset": "llama-2-70b"}, resources={"gpu": "A100-SXM-80GB"})
    p = estimate(spec, layout(sharding="ddp", dp_shard=1, activation_checkpointing="full"))
    assert not p.fits and p.memory.total > p.memory.gpu_memory


# --- Korthikanti et al. 2022, Table 2 (GPT-3 175B: a=96, h=12288, s=2048) --------------------------


@pytest.fixture(scope="module")
def gpt3():
    return resolve_model(ModelSpec(preset="gpt3-175b"))


def acts(shape, *, t: int = 1, sp: bool = False, ckpt: str = "none", b: int = 1) -> float:
    return layer_activation_bytes(shape, micro_batch=b, seq_local=shape.seq_len, tp=t, sequence_parallel=sp,
                                  checkpointing=ckpt, attention="eager", precision="bf16")


@pytest.mark.parametrize("t", [1, 2, 8])
def test_korthikanti_table2_exactly(gpt3, t: int) -> None:
    s, b, h, a = gpt3.seq_len, 1, gpt3.hidden, gpt3.heads
    sbh = s * b * h
    quad = 5 * a * s / h
    assert acts(gpt3) == pytest.approx(sbh * (34 + quad), rel=1e-12)
    assert acts(gpt3, t=t) == pytest.approx(sbh * (10 + 24 / t + quad / t), rel=1e-12)
    assert acts(gpt3, t=t, sp=True) == pytest.approx(sbh * (34 / t + quad / t), rel=1e-12)
    assert acts(gpt3, t=t, ckpt="selective") == pytest.approx(sbh * (10 + 24 / t), rel=1e-12)
    assert acts(gpt3, t=t, sp=True, ckpt="selective") == pytest.approx(sbh * 34 / t, rel=1e-12)
    assert acts(gpt3, ckpt="full") == 2 * sbh


def test_selective_recompute_saves_70_percent_for_gpt3(gpt3) -> None:
    # Korthikanti: 5as/h = 80 for GPT-3, so selective keeps 34 of 114 -> saves 70%.
    assert 1 - acts(gpt3, ckpt="selective") / acts(gpt3) == pytest.approx(0.70, abs=0.005)


def test_1f1b_first_stage_holds_l_layers_worth_regardless_of_p(gpt3) -> None:
    # Eq. 5: (s b h L / t)(34 + 5as/h), plus the embedding's dropout mask s b h p / t (Sec. 4.3) and
    # the int64 input ids, one per micro-batch in flight.
    s, h, t = gpt3.seq_len, gpt3.hidden, 8
    layers = gpt3.layers * acts(gpt3, t=t, sp=True)
    for p in (1, 2, 4, 8, 16):
        staged = activation_memory(gpt3, layout(dp=1, tp=t, pp=p, sequence_parallel=True, grad_accum_steps=16,
                                                pipeline_schedule="1f1b" if p > 1 else None),
                                   precision="bf16", attention="eager")
        assert staged.first == pytest.approx(layers + p * (s * h / t + 8 * s), rel=1e-12)


def test_interleaving_adds_the_1_plus_p_minus_1_over_pm_factor(gpt3) -> None:
    kw = {"dp": 1, "tp": 8, "pp": 8, "sequence_parallel": True, "grad_accum_steps": 16}
    plain = activation_memory(gpt3, layout(pipeline_schedule="1f1b", **kw), precision="bf16", attention="eager")
    inter = activation_memory(gpt3, layout(pipeline_schedule="interleaved", virtual_stages=4, **kw),
                              precision="bf16", attention="eager")
    assert inter.first / plain.first == pytest.approx(1 + 7 / (8 * 4), rel=1e-9)


def test_gpipe_holds_every_micro_batch(gpt3) -> None:
    kw = {"dp": 1, "tp": 8, "pp": 4, "sequence_parallel": True}
    one = activation_memory(gpt3, layout(pipeline_schedule="gpipe", grad_accum_steps=4, **kw), precision="bf16",
                            attention="eager")
    four = activation_memory(gpt3, layout(pipeline_schedule="gpipe", grad_accum_steps=16, **kw),
                             precision="bf16", attention="eager")
    assert four.first == pytest.approx(4 * one.first, rel=0.01)


# --- Llama specifics (planner-formulas.md §7.4, §7.5) ------------------------------------------


def test_llama3_8b_flash_layer_is_about_41_sbh() -> None:
    shape = resolve_model(ModelSpec(preset="llama-3.1-8b"))
    sbh = shape.seq_len * shape.hidden
    per_layer = layer_activation_bytes(shape, micro_batch=1, seq_local=shape.seq_len, tp=1, sequence_parallel=False,
                                       checkpointing="none", attention="flash", precision="bf16")
    assert per_layer / sbh == pytest.approx(41, abs=0.05)
    # Nothing quadratic in s is stored under flash attention; eager stores the scores.
    eager = layer_activation_bytes(shape, micro_batch=1, seq_local=shape.seq_len, tp=1, sequence_parallel=False,
                                   checkpointing="none", attention="eager", precision="bf16")
    assert eager - per_layer > 2 * shape.heads * shape.seq_len**2 * 0.99


def test_llama3_logits_and_loss_buffers_are_2_to_3_fp32_copies() -> None:
    shape = resolve_model(ModelSpec(preset="llama-3.1-8b"))
    one_fp32_copy = 2 * 8192 * 128256 * 4
    assert one_fp32_copy / GIB == pytest.approx(7.83, abs=0.01)
    total = logits_bytes(shape, micro_batch=2, seq_local=8192, tp=1, precision="bf16")
    assert 2 * one_fp32_copy < total < 3 * one_fp32_copy


def test_runtime_overhead_grows_with_communicators() -> None:
    ctx = resolve(make_spec())
    plain = runtime_overhead_bytes(ctx.cluster, layout(dp=8))
    three_d = runtime_overhead_bytes(ctx.cluster, layout(dp=2, tp=2, pp=2))
    assert three_d > plain > 0


def test_offload_moves_states_to_host_memory() -> None:
    psi = 1e9
    none = model_state_bytes(psi, 1e7, layout(), "bf16", "adamw")
    opt = model_state_bytes(psi, 1e7, layout(offload="optimizer"), "bf16", "adamw")
    full = model_state_bytes(psi, 1e7, layout(offload="params"), "bf16", "adamw")
    assert opt.optimizer == 0 and opt.cpu_bytes == none.optimizer and opt.params == none.params
    assert full.params == full.grads == full.optimizer == 0
    assert full.cpu_bytes == none.params + none.grads + none.optimizer
    assert full.comm_buffers == none.comm_buffers  # gathered units still live on the GPU


def test_zero3_gathers_the_largest_unit_with_prefetch() -> None:
    s = model_state_bytes(1e9, 1e8, layout(), "bf16", "adamw")
    # Two bf16 units in flight plus one unit's bf16 grads and fp32 reduce-scatter input.
    assert s.comm_buffers == 2 * 2 * 1e8 + (2 + 4) * 1e8


@pytest.mark.parametrize("sharding", ["fsdp", "zero2", "hsdp"])
def test_a_sharded_pipeline_stage_keeps_its_params_and_fp32_grads_unsharded(sharding: str) -> None:
    # torch.distributed.pipelining (the runtime, torchtitan) neither reshards a stage after backward
    # nor reduce-scatters its gradients until the last micro-batch: the stage's bf16 parameters
    # (2 bytes) and fp32 gradient accumulators (4 bytes) are whole on every rank besides the shards.
    # torchtitan's Llama 3.1 405B at FSDP 8 x TP 8 x PP 8 measured 82.5 GiB where shards alone give 40.
    psi, unit, n = 1e9, 1e8, 8
    kw = {"sharding": sharding, "dp_shard": 4 if sharding == "hsdp" else n, "grad_accum_steps": 4}
    flat = model_state_bytes(psi, unit, layout(**kw), "bf16", "adamw")
    piped = model_state_bytes(psi, unit, layout(pp=2, pipeline_schedule="1f1b", **kw), "bf16", "adamw")
    # The shards are what a rank keeps between steps (what the runtime reports as params and grads).
    assert (piped.params, piped.grads, piped.optimizer) == (flat.params, flat.grads, flat.optimizer)
    assert piped.comm_buffers == (2 + 4) * psi + (2 + 4) * unit
    if sharding == "fsdp":  # offloading moves the shards to the host, not the unsharded stage
        offloaded = model_state_bytes(psi, unit, layout(pp=2, pipeline_schedule="1f1b", offload="params", **kw),
                                      "bf16", "adamw")
        assert offloaded.grads == offloaded.params == 0 and offloaded.comm_buffers == piped.comm_buffers


def test_ddp_gradients_are_views_into_its_buckets() -> None:
    # The runtime sets gradient_as_bucket_view=True, so DDP and ZeRO-1 hold no second gradient copy.
    for sharding in ("ddp", "zero1"):
        s = model_state_bytes(1e9, 1e8, layout(sharding=sharding, dp_shard=1 if sharding == "ddp" else 8), "bf16",
                              "adamw")
        assert s.comm_buffers == 0


def test_breakdown_is_most_loaded_rank_with_pipeline() -> None:
    spec = make_spec(model={"preset": "llama-3.1-70b"}, resources={"nodes": 4}, training={"global_batch": 64})
    p = estimate(spec, layout(dp=2, tp=8, pp=2, sharding="fsdp", dp_shard=2, sequence_parallel=True,
                              grad_accum_steps=32, pipeline_schedule="1f1b", activation_checkpointing="full"))
    parts = (p.memory.params + p.memory.grads + p.memory.optimizer + p.memory.activations + p.memory.logits
             + p.memory.comm_buffers + p.memory.runtime_overhead + p.memory.allocator_margin)
    assert abs(parts - p.memory.total) <= 8  # each part is rounded down to whole bytes
    assert math.isclose(p.memory.allocator_margin, 0.05 * (parts - p.memory.runtime_overhead
                                                           - p.memory.allocator_margin), rel_tol=1e-6)
