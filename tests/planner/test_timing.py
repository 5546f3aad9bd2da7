"""Time model: FLOP conventions, collective volumes, bubble, and a published throughput."""

from __future__ import annotations

import pytest

from service.planner import InvalidSpec, Layout, estimate
from service.planner.hardware import CATALOG, resolve_cluster
from service.planner.memory import layer_activation_bytes, stage_params
from service.planner.models import resolve_model
from service.planner.search import resolve
from service.planner.timing import forward_times, model_flops_per_step, recompute_flops_per_step, step_time
from service.spec import ModelSpec
from tests.conftest import make_spec
from tests.support.planner import layout

GPT_NO_BIAS = ModelSpec(layers=96, hidden=12288, heads=96, vocab=51200, seq_len=2048, mlp="gelu",
                        norm="layernorm", tied_embeddings=True, positional="learned", bias=False)


def test_model_flops_are_korthikanti_eq7_with_causal_attention_counted_at_half() -> None:
    # Eq. 7's attention term s/(6h) counts the full s x s scores; the planner's one convention
    # (FLOPs, MFU and time) counts a causal decoder's half: s/(12h).
    shape = resolve_model(GPT_NO_BIAS)
    B, L, s, h, V = 1536, shape.layers, shape.seq_len, shape.hidden, shape.vocab
    eq7 = 72 * B * L * s * h * h * (1 + s / (12 * h) + V / (12 * h * L))
    assert model_flops_per_step(shape, B) == pytest.approx(eq7, rel=1e-12)


def test_full_recompute_hardware_flops_are_narayanan_eq3_with_causal_attention_at_half() -> None:
    # Eq. 3 counts the recompute forward: 96 B s l h^2 (1 + s/6h + V/16lh); causal: s/12h.
    shape = resolve_model(GPT_NO_BIAS)
    B, L, s, h, V = 1536, shape.layers, shape.seq_len, shape.hidden, shape.vocab
    eq3 = 96 * B * s * L * h * h * (1 + s / (12 * h) + V / (16 * L * h))
    total = model_flops_per_step(shape, B) + recompute_flops_per_step(shape, B, "full", "flash")
    assert total == pytest.approx(eq3, rel=1e-12)


def test_selective_recompute_costs_only_the_attention_core_forward() -> None:
    shape = resolve_model(GPT_NO_BIAS)
    B = 8
    extra = recompute_flops_per_step(shape, B, "selective", "eager")
    assert extra == 0.5 * 4 * shape.layers * shape.hidden * shape.seq_len**2 * B  # causal half
    assert recompute_flops_per_step(shape, B, "selective", "flash") == 0  # nothing quadratic to rebuild
    assert recompute_flops_per_step(shape, B, "none", "eager") == 0


def _gpt1t_spec():
    return make_spec(model={"preset": "gpt-1t"}, training={"global_batch": 3072, "precision": "fp16"},
                     resources={"gpu": "A100-SXM-80GB", "nodes": 384})


def test_narayanan_1t_run_throughput_is_reproduced_within_15_percent() -> None:
    # Narayanan et al. 2021: 1T parameters on 3072 A100s with t=8, p=64, d=6, B=3072, b=1 and
    # activation recompute reached 502 PFLOP/s in their Eq. 3 convention: 163 TFLOP/s per GPU.
    spec = _gpt1t_spec()
    p = estimate(spec, Layout(dp=6, tp=8, pp=64, cp=1, sharding="ddp", dp_shard=1, sequence_parallel=False,
                              micro_batch=1, grad_accum_steps=512, activation_checkpointing="full",
                              pipeline_schedule="interleaved", virtual_stages=2, offload="none"))
    shape = resolve_model(spec.model)
    B, s, L, h, V = 3072, shape.seq_len, shape.layers, shape.hidden, shape.vocab
    eq3 = 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
    per_gpu = eq3 / p.time.step_s / 3072
    assert p.fits
    assert per_gpu == pytest.approx(163e12, rel=0.15)


def test_pipeline_bubble_is_p_minus_1_over_m() -> None:
    spec = make_spec(model={"preset": "llama-3.1-70b"}, training={"global_batch": 64}, resources={"nodes": 4})
    for sched, v in (("1f1b", 1), ("gpipe", 1), ("interleaved", 2)):
        p = estimate(spec, layout(dp=2, tp=8, pp=2, sharding="fsdp", dp_shard=2, sequence_parallel=True,
                                  grad_accum_steps=32, pipeline_schedule=sched, virtual_stages=v,
                                  activation_checkpointing="full"))
        t = p.time
        assert t.bubble_s / (t.compute_s + t.recompute_s) == pytest.approx((2 - 1) / 32 / v, rel=1e-9)


def test_zero3_moves_1_5x_ddp_volume_independent_of_layer_count() -> None:
    # fp32 so that every collective moves 4-byte elements: ZeRO-3 is AG + AG + RS = 3Ψ(n-1)/n,
    # DDP's all-reduce 2Ψ(n-1)/n.
    def dp_bytes(layers: int, sharding: str) -> int:
        spec = make_spec(model={"preset": "llama-2-7b", "layers": layers},
                         training={"precision": "fp32", "global_batch": 8})
        p = estimate(spec, layout(sharding=sharding, dp_shard=1 if sharding == "ddp" else 8, grad_accum_steps=1,
                                  activation_checkpointing="full"))
        return p.comm.dp

    assert dp_bytes(32, "fsdp") / dp_bytes(32, "ddp") == pytest.approx(1.5, rel=1e-6)
    shape32 = resolve_model(ModelSpec(preset="llama-2-7b"))
    psi = shape32.total_params
    assert dp_bytes(32, "fsdp") == pytest.approx(3 * psi * 4 * 7 / 8, rel=1e-6)
    # Same parameter count spread over 16 wider layers would move the same bytes: volume is per
    # parameter, not per layer.
    shape16 = resolve_model(ModelSpec(preset="llama-2-7b", layers=16))
    assert dp_bytes(16, "fsdp") / shape16.total_params == pytest.approx(dp_bytes(32, "fsdp") / psi, rel=1e-6)


def test_fsdp_regathers_parameters_every_micro_batch() -> None:
    spec = make_spec(training={"global_batch": 32})
    one = estimate(spec, layout(micro_batch=4, grad_accum_steps=1, activation_checkpointing="full"))
    four = estimate(spec, layout(micro_batch=1, grad_accum_steps=4, activation_checkpointing="full"))
    assert four.comm.dp == pytest.approx(4 * one.comm.dp, rel=1e-9)


def test_tensor_parallel_volume_is_narayanan_8bsh_per_layer() -> None:
    spec = make_spec(training={"global_batch": 8})
    t, b, m = 4, 2, 2
    p = estimate(spec, layout(dp=2, tp=t, sharding="fsdp", dp_shard=2, sequence_parallel=True, micro_batch=b,
                              grad_accum_steps=m))
    shape = resolve_model(spec.model)
    per_layer = 8 * b * shape.seq_len * shape.hidden * (t - 1) / t * 2  # elements x 2 bytes (bf16)
    assert p.comm.tp == pytest.approx(m * shape.layers * per_layer, rel=1e-9)


def test_tensor_parallel_across_nodes_is_slower_and_warned() -> None:
    spec = make_spec(model={"preset": "gpt3-175b"}, training={"global_batch": 64}, resources={"nodes": 8})
    kw = {"pp": 4, "sharding": "ddp", "dp_shard": 1, "sequence_parallel": True,
          "pipeline_schedule": "1f1b", "activation_checkpointing": "full"}
    inside = estimate(spec, layout(tp=8, dp=2, grad_accum_steps=32, **kw))
    across = estimate(spec, layout(tp=16, dp=1, grad_accum_steps=64, **kw))
    assert across.time.comm_exposed_s > inside.time.comm_exposed_s
    assert any("crosses nodes" in w for w in across.warnings)
    assert not any("crosses nodes" in w for w in inside.warnings)


def test_mfu_uses_the_dense_peak_of_the_training_precision() -> None:
    bf16 = estimate(make_spec(), layout())
    fp8 = estimate(make_spec(training={"precision": "fp8"}), layout())
    assert bf16.time.peak_flops_per_gpu == 989e12  # never the 1979 with-sparsity figure
    assert fp8.time.peak_flops_per_gpu == 1979e12
    assert fp8.time.step_s < bf16.time.step_s
    assert "6 x matmul params" in bf16.time.flop_convention


def test_fp16_asks_for_a_loss_scaler_and_bf16_does_not() -> None:
    assert estimate(make_spec(training={"precision": "fp16"}), layout()).precision.loss_scaler
    assert not estimate(make_spec(), layout()).precision.loss_scaler


def test_v100_has_no_bf16() -> None:
    with pytest.raises(InvalidSpec) as info:
        estimate(make_spec(resources={"gpu": "V100-SXM-32GB"}), layout())
    assert info.value.problems[0].loc == ("training", "precision")
    assert "fp16" in info.value.problems[0].message


def test_offload_adds_step_time() -> None:
    spec = make_spec()
    base = estimate(spec, layout(activation_checkpointing="full"))
    for mode in ("optimizer", "params"):
        off = estimate(spec, layout(activation_checkpointing="full", offload=mode))
        assert off.time.offload_s > 0 and off.time.step_s > base.time.step_s
        assert off.comm.offload > 0 and off.memory.cpu_memory


def test_checkpointing_costs_recompute_time() -> None:
    spec = make_spec()
    none = estimate(spec, layout())
    full = estimate(spec, layout(activation_checkpointing="full"))
    assert none.time.recompute_s == 0
    assert full.time.recompute_s == pytest.approx(full.time.compute_s / 3, rel=0.1)
    assert full.time.hardware_flops_per_step > full.time.model_flops_per_step == none.time.model_flops_per_step


def test_a_cross_node_collective_gets_one_nic_per_rank_of_its_group_in_each_node() -> None:
    # NCCL runs one ring channel per NIC: a group with k ranks in each node has k NICs' bandwidth,
    # up to NVLink's; one rank per node (stride = GPUs per node) has one NIC.
    a100 = resolve_cluster(make_spec(resources={"gpu": "A100-SXM-80GB", "nodes": 8}).resources)
    nic, nvlink = a100.inter_node_gbps, a100.intra_node_gbps
    assert a100.collective_gbps(8, 8) == nvlink  # inside a node
    assert a100.collective_gbps(64, 64) == min(nvlink, 8 * nic)  # dp=64 at tp=1: 8 ranks per node
    assert a100.collective_gbps(16, 64) == 2 * nic  # dp=16 at tp=4: 2 ranks per node
    assert a100.collective_gbps(8, 64) == nic  # dp=8 at tp=8: one rank per node
    fast_nics = resolve_cluster(make_spec(resources={"nodes": 8, "inter_node_gbps": 100}).resources)
    assert fast_nics.collective_gbps(64, 64) == fast_nics.intra_node_gbps < 8 * 100  # NVLink caps it
    cpu = resolve_cluster(make_spec(resources={"gpu": "cpu", "nodes": 4}).resources)
    assert cpu.collective_gbps(cpu.world_size, cpu.world_size) == cpu.inter_node_gbps  # gloo: no rings per NIC


def test_fsdp_gathers_over_all_nics_of_a_node_hide_behind_compute() -> None:
    # torchtitan's Llama 2 70B on 64 A100 at micro-batch 1 (benchmarks/published): about 560 GB per
    # GPU per step, which one 25 GB/s NIC could not move in the published 11.5 s step, but 8 can.
    spec = make_spec(model={"preset": "llama-2-70b"}, training={"global_batch": 64},
                     resources={"gpu": "A100-SXM-80GB", "nodes": 8})
    p = estimate(spec, layout(dp=64, sharding="fsdp", dp_shard=64, grad_accum_steps=1,
                              activation_checkpointing="full"))
    assert p.time.comm_exposed_s < 0.05 * p.time.compute_s


@pytest.mark.parametrize("gpu", ["H100-SXM-80GB", "A100-SXM-80GB", "B200-180GB"])
def test_flash_attention_runs_at_its_own_efficiency_and_eager_attention_at_the_gemms(gpu: str) -> None:
    # Flash kernels do the causal half of the score FLOPs at `flash_attention_efficiency` of peak
    # (FlashAttention-3's paper: FA2 reaches 35% on H100); eager attention's two batched GEMMs do
    # the whole square at the GEMM efficiency. A GPU without a published figure uses the GEMMs'.
    spec = make_spec(resources={"gpu": gpu})
    ctx = resolve(spec)
    lay = layout(micro_batch=1, grad_accum_steps=4)
    flash = forward_times(ctx.shape, ctx.cluster, lay, precision="bf16", attention="flash")
    eager = forward_times(ctx.shape, ctx.cluster, lay, precision="bf16", attention="eager")
    kind = CATALOG[gpu]
    share = (kind.flash_attention_efficiency or kind.matmul_efficiency) / kind.matmul_efficiency
    assert flash.attn_f == pytest.approx(0.5 * eager.attn_f / share, rel=1e-9)


def test_megatron_pipelines_send_a_tp_ranks_slice_and_torch_pipelining_the_whole_activation() -> None:
    # Without sequence parallelism every TP rank holds the whole stage output. Megatron-LM (DDP with
    # TP, a layout only Megatron builds) scatters it: each rank sends 1/t and the receiver gathers
    # over NVLink. shardctl's runtime (FSDP with TP) sends the whole tensor from each rank.
    spec = make_spec(model={"preset": "gpt3-175b"}, training={"global_batch": 64, "precision": "fp16"},
                     resources={"nodes": 8})
    kw = {"tp": 8, "dp": 2, "pp": 4, "grad_accum_steps": 32, "pipeline_schedule": "1f1b",
          "activation_checkpointing": "full"}
    megatron = estimate(spec, layout(sharding="ddp", dp_shard=1, sequence_parallel=False, **kw))
    megatron_sp = estimate(spec, layout(sharding="ddp", dp_shard=1, sequence_parallel=True, **kw))
    torch_pp = estimate(spec, layout(sharding="fsdp", dp_shard=2, sequence_parallel=False, **kw))
    assert megatron.comm.pp == pytest.approx(megatron_sp.comm.pp, rel=1e-9)
    assert torch_pp.comm.pp == pytest.approx(8 * megatron.comm.pp, rel=1e-9)


def test_memory_bound_work_reads_and_writes_each_activation_at_the_sustained_hbm_rate() -> None:
    # Norms, activations, residual adds: each reads its input and writes its output (two passes over
    # the bytes the layer stores) at the 87% of peak HBM bandwidth streaming kernels sustain.
    def layer_f(hbm_gbps: float) -> float:
        spec = make_spec(resources={"gpu": {"name": "H100-SXM-80GB", "hbm_gbps": hbm_gbps}})
        ctx = resolve(spec)
        return forward_times(ctx.shape, ctx.cluster, layout(), precision="bf16", attention="flash").layer_f

    ctx = resolve(make_spec())
    lay = layout()
    stored = layer_activation_bytes(ctx.shape, micro_batch=lay.micro_batch, seq_local=ctx.shape.seq_len, tp=1,
                                    sequence_parallel=False, checkpointing="none", attention="flash",
                                    precision="bf16")
    expected = 2 * stored / 0.87 * (1 / 1000e9 - 1 / 2000e9)
    assert layer_f(1000) - layer_f(2000) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize(("sharding", "precision", "per_param"), [
    ("fsdp", "bf16", 2 * 2 * 2 + 2 + 4),  # two gathers' copy-out (2 x bf16 each) + bf16 grads into fp32
    ("zero2", "bf16", 1 * 2 * 2 + 2 + 4),  # gathered once per micro-batch
    ("fsdp", "fp32", 2 * 2 * 4 + 4 + 4),
    ("ddp", "bf16", 0),
])
def test_fsdp_copies_around_its_collectives_are_compute_stream_time(sharding: str, precision: str,
                                                                    per_param: int) -> None:
    # FSDP2 copies each gathered flat buffer out into the parameters and each unit's gradients into
    # the fp32 reduce-scatter input on the compute stream: bytes per parameter and micro-batch at
    # the sustained HBM rate, on top of the layers' own time. DDP has no such copies.
    ctx = resolve(make_spec(training={"precision": precision}))
    lay = layout(sharding=sharding, dp_shard=1 if sharding == "ddp" else 8, grad_accum_steps=4)
    fwd = forward_times(ctx.shape, ctx.cluster, lay, precision=precision, attention="flash")
    t = step_time(ctx.shape, ctx.cluster, lay, precision=precision, optimizer="adamw", attention="flash",
                  forward=fwd)
    layers_only = 4 * 3 * (fwd.layers * fwd.layer_f + fwd.head_f)
    psi = stage_params(ctx.shape, lay).first
    hbm = ctx.cluster.gpu.hbm_gbps * 1e9 * 0.87
    assert t.compute_s - layers_only == pytest.approx(4 * per_param * psi / hbm, rel=1e-9, abs=1e-12)
