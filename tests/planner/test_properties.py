"""Properties that must hold for any model, layout and cluster (hypothesis)."""

from __future__ import annotations

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from service.planner import InvalidSpec, Layout, estimate, plan
from service.planner.memory import layer_activation_bytes, model_state_bytes
from service.planner.models import resolve_model
from service.spec import ModelSpec, TrainingSpec

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

heads_st = st.sampled_from([8, 16, 32])
models = st.builds(
    lambda layers, heads, head_dim, group, ffn_mult, vocab, seq, mlp, dropout: ModelSpec(
        layers=layers, hidden=heads * head_dim, heads=heads, kv_heads=heads // group,
        ffn_hidden=heads * head_dim * ffn_mult, vocab=vocab, seq_len=seq, mlp=mlp, dropout=dropout),
    layers=st.sampled_from([2, 4, 8, 12, 24]), heads=heads_st, head_dim=st.sampled_from([32, 64, 128]),
    group=st.sampled_from([1, 2, 4, 8]), ffn_mult=st.sampled_from([2, 3, 4]),
    vocab=st.sampled_from([1000, 32000, 128256]), seq=st.sampled_from([512, 1024, 2048, 4096]),
    mlp=st.sampled_from(["swiglu", "gelu"]), dropout=st.sampled_from([0.0, 0.1]),
)
layouts = st.fixed_dictionaries({
    "tp": st.sampled_from([1, 2, 4]), "pp": st.sampled_from([1, 2]), "cp": st.sampled_from([1, 2]),
    "sharding": st.sampled_from(["ddp", "zero1", "zero2", "zero3", "fsdp"]),
    "micro_batch": st.sampled_from([1, 2]), "activation_checkpointing": st.sampled_from(["none", "selective", "full"]),
    "offload": st.sampled_from(["none", "optimizer", "params"]),
    "precision": st.sampled_from(["bf16", "fp32", "fp16"]), "attention": st.sampled_from(["flash", "eager"]),
})


def _spec(model: ModelSpec, precision: str, attention: str) -> TrainingSpec:
    return TrainingSpec.model_validate({
        "name": "prop", "model": model.model_dump(exclude_none=True),
        "training": {"global_batch": 16, "precision": precision, "attention": attention},
        "resources": {"gpu": "A100-SXM-80GB", "gpus_per_node": 8, "nodes": 1},
    })


@SETTINGS
@given(model=models, choice=layouts)
def test_the_breakdown_sums_to_the_total(model: ModelSpec, choice: dict[str, object]) -> None:
    tp, pp, cp = int(choice["tp"]), int(choice["pp"]), int(choice["cp"])  # type: ignore[call-overload]
    sharding, off = str(choice["sharding"]), str(choice["offload"])
    assume(not (off == "params" and sharding not in ("zero3", "fsdp")))
    assume(not (off == "optimizer" and sharding == "ddp"))
    assume(not (cp > 1 and choice["attention"] == "eager"))
    assume(tp * pp * cp <= 8)
    dp = 8 // (tp * pp * cp)
    mb = int(choice["micro_batch"])  # type: ignore[call-overload]
    spec = _spec(model, str(choice["precision"]), str(choice["attention"]))
    lay = Layout(dp=dp, tp=tp, pp=pp, cp=cp, sharding=sharding, dp_shard=1 if sharding == "ddp" else dp,  # type: ignore[arg-type]
                 sequence_parallel=tp > 1, micro_batch=mb, grad_accum_steps=16 // (dp * mb),
                 activation_checkpointing=choice["activation_checkpointing"],  # type: ignore[arg-type]
                 pipeline_schedule="1f1b" if pp > 1 else None, virtual_stages=1, offload=off)  # type: ignore[arg-type]
    try:
        p = estimate(spec, lay)
    except InvalidSpec:
        assume(False)
        return
    m = p.memory
    parts = (m.params + m.grads + m.optimizer + m.activations + m.logits + m.comm_buffers + m.runtime_overhead
             + m.allocator_margin)
    assert abs(parts - m.total) <= 8
    assert m.fits == (m.total <= m.gpu_memory)
    t = p.time
    assert abs(t.compute_s + t.recompute_s + t.comm_exposed_s + t.bubble_s + t.optimizer_s + t.offload_s
               - t.step_s) <= 1e-9 * t.step_s
    assert 0 < t.mfu < 1


@SETTINGS
@given(psi=st.floats(1e6, 1e12), unit=st.floats(0, 1e9), n=st.sampled_from([1, 2, 4, 8, 64, 1024]),
       optimizer=st.sampled_from(["adamw", "sgd", "adam8bit"]))
def test_more_data_parallel_ranks_never_raise_zero3_model_state(psi: float, unit: float, n: int,
                                                                optimizer: str) -> None:
    def per_gpu(ranks: int) -> float:
        lay = Layout(dp=ranks, tp=1, pp=1, cp=1, sharding="zero3", dp_shard=ranks, sequence_parallel=False,
                     micro_batch=1, grad_accum_steps=1, activation_checkpointing="none", pipeline_schedule=None,
                     virtual_stages=1, offload="none")
        s = model_state_bytes(psi, min(unit, psi), lay, "bf16", optimizer)  # type: ignore[arg-type]
        return s.params + s.grads + s.optimizer + s.comm_buffers

    assert per_gpu(2 * n) <= per_gpu(n)


@SETTINGS
@given(model=models, tp=st.sampled_from([1, 2, 4]), sp=st.booleans(), b=st.sampled_from([1, 2, 8]),
       attention=st.sampled_from(["flash", "eager"]), precision=st.sampled_from(["bf16", "fp32"]))
def test_checkpointing_never_raises_activation_memory(model: ModelSpec, tp: int, sp: bool, b: int, attention: str,
                                                      precision: str) -> None:
    shape = resolve_model(model)
    assume(shape.heads % tp == 0 and shape.kv_heads % tp == 0)

    def acts(ckpt: str) -> float:
        return layer_activation_bytes(
            shape, micro_batch=b, seq_local=shape.seq_len, tp=tp, sequence_parallel=sp and tp > 1,
            checkpointing=ckpt, attention=attention, precision=precision)  # type: ignore[arg-type]

    assert acts("full") <= acts("selective") <= acts("none")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=models, gpus=st.sampled_from([1, 2, 4, 8, 16]), batch=st.sampled_from([8, 16, 64]),
       gpu=st.sampled_from(["A100-SXM-40GB", "H100-SXM-80GB", "L40S-48GB"]))
def test_a_fitting_plan_never_exceeds_the_gpu_in_its_own_breakdown(model: ModelSpec, gpus: int, batch: int,
                                                                   gpu: str) -> None:
    spec = TrainingSpec.model_validate({
        "name": "prop", "model": model.model_dump(exclude_none=True), "training": {"global_batch": batch},
        "resources": {"gpu": gpu, "gpus_per_node": min(gpus, 8), "gpus": gpus},
    })
    p = plan(spec)
    if p.fits:
        assert p.memory.total <= p.memory.gpu_memory
        assert all(alt.memory_total <= p.memory.gpu_memory for alt in p.alternatives)
        if p.memory.cpu_memory is not None:
            assert p.memory.cpu_memory <= (p.memory.cpu_memory_available or 0)
    else:
        assert p.reasons
