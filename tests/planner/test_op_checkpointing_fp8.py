"""Op-level selective activation checkpointing (`op`) and FP8 in the planner: bytes, time, search.

Derivations (docs/planner.md, "Op-level selective checkpointing" and "FP8"):
- `op` keeps per layer, per micro-batch row and position, without TP: the layer input (h), the
  outputs of the 1st, 3rd, 5th and 7th matmul (q: h, v: kv, w1: f, w2: h), the attention output (h),
  all in e bytes, plus flash attention's fp32 log-sum-exp (4 a per position);
- it recomputes the 2nd, 4th and 6th matmul (k, o, w3: 2h^2 + hf of Llama-2-7B's 4h^2 + 3hf
  weights, 39%) and the memory-bound ops, never attention.
- FP8 runs the linear layers at the bf16 rate times a size-dependent gain plus per-tensor scaling;
  its constants reproduce the torchao.float8 README's H100 figures.
"""

from __future__ import annotations

import pytest

from service.planner import InvalidSpec, estimate, plan
from service.planner.hardware import CATALOG
from service.planner.layer_matmuls import op_recomputed_share
from service.planner.memory import activation_memory, layer_activation_bytes
from service.planner.models import resolve_model
from service.planner.runnable import runtime_gaps
from service.planner.search import resolve
from service.planner.timing import forward_times, linear_seconds, recompute_flops_per_step, step_time
from service.spec import ModelSpec
from tests.conftest import make_spec
from tests.support.planner import layout

MODES = ("none", "op", "full")


def _layer(shape, ckpt: str, *, t: int = 1, sp: bool = False, attention: str = "flash") -> float:
    return layer_activation_bytes(shape, micro_batch=1, seq_local=shape.seq_len, tp=t, sequence_parallel=sp,
                                  checkpointing=ckpt, attention=attention, precision="bf16")


def test_op_keeps_the_layer_input_the_odd_matmuls_and_attention_outputs_of_llama2_7b() -> None:
    shape = resolve_model(ModelSpec(preset="llama-2-7b"))
    s, h, kv, f, a, e = 4096, 4096, 4096, 11008, 32, 2
    derived = e * s * (h + h + kv + f + h + h) + 4 * a * s
    assert _layer(shape, "op") == derived
    # 7.69 sbh (+ 0.016 for the log-sum-exp) between Korthikanti's 18.75 sbh (none) and 1 sbh (full).
    assert _layer(shape, "op") / (e * s * h) == pytest.approx(7.6875 + 4 * a / (e * h))


@pytest.mark.parametrize("preset,t,sp", [("llama-2-7b", 1, False), ("llama-3.1-8b", 1, False),
                                         ("llama-3.1-70b", 8, True), ("llama-3.1-70b", 8, False),
                                         ("gpt3-175b", 8, True)])
def test_op_sits_between_none_and_full_in_activation_bytes(preset: str, t: int, sp: bool) -> None:
    shape = resolve_model(ModelSpec(preset=preset))
    none, op, full = (_layer(shape, m, t=t, sp=sp) for m in MODES)
    assert none > op > full


def test_tp_splits_only_the_column_parallel_outputs_under_op() -> None:
    # Row-parallel w2's output is a full-width partial sum on every TP rank; SP adds the split
    # reduce-scatter outputs of o and w2, and splits the layer input.
    shape = resolve_model(ModelSpec(preset="llama-2-7b"))
    s, h, kv, f, a, e, t = 4096, 4096, 4096, 11008, 32, 2, 8
    no_sp = e * s * (h + (h + kv + f + h) / t + h) + 4 * a * s / t
    assert _layer(shape, "op", t=t) == pytest.approx(no_sp)
    with_sp = e * s * (h / t + (h + kv + f + h) / t + h + 2 * h / t) + 4 * a * s / t
    assert _layer(shape, "op", t=t, sp=True) == pytest.approx(with_sp)


def test_op_under_eager_attention_keeps_the_scores_instead_of_the_log_sum_exp() -> None:
    shape = resolve_model(ModelSpec(preset="llama-2-7b"))
    s, a, e = 4096, 32, 2
    assert _layer(shape, "op", attention="eager") - _layer(shape, "op") == e * a * s * s - 4 * a * s


def test_op_recomputes_39_percent_of_a_llama2_7b_layers_matmuls() -> None:
    shape = resolve_model(ModelSpec(preset="llama-2-7b"))
    h, f = 4096, 11008
    assert op_recomputed_share(shape) == pytest.approx((2 * h * h + h * f) / (4 * h * h + 3 * h * f))
    extra = recompute_flops_per_step(shape, 8, "op", "flash")
    assert extra == pytest.approx(2 * 32 * (2 * h * h + h * f) * 8 * 4096)


def _spec(preset: str = "llama-2-7b", precision: str = "bf16", gpu: str = "H100-SXM-80GB", batch: int = 32):
    return make_spec(model={"preset": preset}, training={"global_batch": batch, "precision": precision},
                     resources={"gpu": gpu, "nodes": 1, "gpus_per_node": 8})


def test_op_step_time_sits_between_none_and_full_and_its_recompute_is_under_the_forward() -> None:
    spec = _spec()
    times = {m: estimate(spec, layout(activation_checkpointing=m)).time for m in MODES}
    assert times["none"].step_s < times["op"].step_s < times["full"].step_s
    assert times["none"].recompute_s == 0
    # Recompute is 39% of the matmuls plus the memory-bound ops: more than a tenth, less than half
    # of what full recompute replays (the whole forward, attention included).
    assert 0.1 < times["op"].recompute_s / times["full"].recompute_s < 0.5


def test_op_adds_the_layer_it_rebuilds_in_backward_to_the_peak() -> None:
    shape = resolve_model(ModelSpec(preset="llama-2-7b"))
    lay = layout(activation_checkpointing="op", grad_accum_steps=1)
    acts = activation_memory(shape, lay, precision="bf16", attention="flash")
    per_layer, none = _layer(shape, "op"), _layer(shape, "none")
    embed = 8 * shape.seq_len
    assert acts.first == pytest.approx(shape.layers * per_layer + embed + (none - per_layer))


def test_search_takes_op_when_no_checkpointing_does_not_fit_and_op_does() -> None:
    # Llama-2-7B on 8 H100 with micro-batch 4 pinned: no checkpointing needs 32 layers x 18.75 sbh
    # x 4 = 75 GiB of activations (101 GiB in all), op 31 GiB (56 GiB); op is faster than full.
    spec = make_spec(model={"preset": "llama-2-7b"}, training={"global_batch": 64, "precision": "bf16"},
                     resources={"gpu": "H100-SXM-80GB", "nodes": 1, "gpus_per_node": 8},
                     layout={"micro_batch": 4, "sharding": "fsdp", "tp": 1, "pp": 1})
    p = plan(spec)
    assert p.layout.activation_checkpointing == "op"
    assert not estimate(spec, layout(micro_batch=4, grad_accum_steps=2)).fits
    assert estimate(spec, layout(micro_batch=4, grad_accum_steps=2, activation_checkpointing="full")).fits


# --- FP8 ------------------------------------------------------------------------------------------


def test_fp8_linear_speedups_reproduce_the_torchao_h100_microbenchmarks() -> None:
    # torchao/float8/README.md (H100, tensorwise dynamic scaling, forward + backward of one linear):
    # M, K, N = 1024, 2048, 1024 -> 0.80x; 4096, 8192, 16384 -> 1.39x. The constants are set from
    # these two points; the tolerance is what a two-constant model can promise.
    gpu = CATALOG["H100-SXM-80GB"]

    def speedup(m: int, k: int, n: int) -> float:
        return linear_seconds(gpu, m, k, n, "bf16") / linear_seconds(gpu, m, k, n, "fp8")

    assert speedup(1024, 2048, 1024) == pytest.approx(0.80, abs=0.1)
    assert speedup(4096, 8192, 16384) == pytest.approx(1.39, abs=0.05)


def _fp8_ratio(gpu: str) -> float:
    # torchao's end-to-end run: Llama-3-8B, 8 GPUs, FSDP2, batch 1 of 8192 tokens, per-op SAC.
    def step(precision: str) -> float:
        spec = _spec("llama-3.1-8b", precision, gpu, batch=8)
        return estimate(spec, layout(activation_checkpointing="op", grad_accum_steps=1)).time.step_s
    return step("bf16") / step("fp8")


def test_fp8_end_to_end_on_h100_matches_torchaos_llama3_8b_run() -> None:
    # Published: 6150 -> 7689.5 tokens/s, 1.25x (tensorwise, fp8 all-gather); the model's constants
    # come from the microbenchmarks above, so this is an independent check. The model predicts
    # 1.19x: its steps are short of the published ones on both sides (bf16 1.07 s vs 1.33 s, fp8
    # 0.90 s vs 1.07 s, like torchtitan's 8B FSDP rows in benchmarks/published), and time counted
    # on both sides alike (FSDP2's copies, gathered in bf16 here though the run gathered fp8)
    # shrinks the ratio; 0.06 holds that and still fails a gain modelled 5% wrong.
    assert _fp8_ratio("H100-SXM-80GB") == pytest.approx(1.25, abs=0.06)


@pytest.mark.parametrize("gpu", ["H100-SXM-80GB", "H100-PCIe-80GB", "H200-SXM-141GB", "B200-180GB",
                                 "MI300X-192GB", "L40S-48GB"])
def test_fp8_gains_less_than_the_peak_ratio_on_every_kind(gpu: str) -> None:
    peak_ratio = CATALOG[gpu].peak_tflops["fp8"] / CATALOG[gpu].peak_tflops["bf16"]
    ratio = _fp8_ratio(gpu)
    assert 1.0 < ratio < 0.75 * peak_ratio


def test_fp8_gains_less_on_mi300x_than_on_h100_as_torchao_measured() -> None:
    # torchao: 1.147x on 8 MI300X against 1.25x on 8 H100 for the same run.
    assert _fp8_ratio("MI300X-192GB") < _fp8_ratio("H100-SXM-80GB")


def test_fp8_gain_shrinks_for_small_gemms() -> None:
    gpu = CATALOG["H100-SXM-80GB"]
    assert gpu.fp8_gemm_gain(256, 1024, 1024) < gpu.fp8_gemm_gain(8192, 8192, 8192) < gpu.fp8_gemm_speedup


def test_fp8_keeps_attention_and_the_output_layer_in_bf16() -> None:
    shape = resolve_model(ModelSpec(preset="llama-3.1-8b"))
    ctx = resolve(_spec("llama-3.1-8b", "fp8"))
    lay = layout(grad_accum_steps=1)
    fp8 = forward_times(shape, ctx.cluster, lay, precision="fp8", attention="flash")
    bf16 = forward_times(shape, ctx.cluster, lay, precision="bf16", attention="flash")
    assert fp8.attn_f == bf16.attn_f and fp8.head_f == bf16.head_f
    assert fp8.layer_f < bf16.layer_f
    t = step_time(shape, ctx.cluster, lay, precision="fp8", optimizer="adamw", attention="flash")
    assert t.step_s > 0


def test_a100_refuses_fp8_naming_the_field_and_the_fix() -> None:
    with pytest.raises(InvalidSpec) as err:
        plan(_spec(precision="fp8", gpu="A100-SXM-80GB"))
    problems = [p for p in err.value.problems if p.loc == ("training", "precision")]
    assert problems and "fp8" in problems[0].message and "bf16" in problems[0].message


def test_fp8_is_a_stated_runtime_gap() -> None:
    gaps = runtime_gaps(layout(), precision="fp8")
    assert [g.field for g in gaps] == ["precision"]
    assert "planner-only" in gaps[0].message and "training.precision: bf16" in gaps[0].message
    assert str(gaps[0]).startswith("training.precision: ")  # where the spec says it, not a layout field
    p = plan(_spec(precision="fp8"))
    assert any("planner-only" in w for w in p.warnings)
