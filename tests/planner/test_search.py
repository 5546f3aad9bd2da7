"""The search: it finds the fastest fitting layout, explains itself and reports what does not fit."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from service.planner import InvalidSpec, Layout, estimate, plan
from service.planner.layout import divisors
from service.planner.runnable import has_gap
from service.planner.search import DEFAULT_MIN_FREE_FRACTION, Base, Mesh
from tests.conftest import make_spec

# A 170M-parameter Llama on 2 nodes x 2 CPU processes with 3 GiB per process: DDP's 16 bytes per
# parameter (2.7 GB) do not fit with activations, sharded layouts do.
SMALL = {
    "model": {"preset": "llama-tiny", "hidden": 1024, "heads": 16, "kv_heads": 4, "ffn_hidden": 2816,
              "layers": 8, "vocab": 32000, "seq_len": 1024},
    "training": {"global_batch": 8, "precision": "bf16"},
    "resources": {"gpu": {"name": "cpu", "memory_gib": 6}, "gpus_per_node": 2, "nodes": 2},
}


def brute_force_best(spec) -> tuple[float, int]:
    """Every layout, evaluated one by one with `estimate`, with no pruning at all: the best step
    time among those the search ranks first (the runtime runs them and they leave the minimum free
    memory; `Context.tier` 0), and how many layouts fit."""
    world = spec.resources.world_size
    best, fitting = float("inf"), 0
    for tp, cp, pp in itertools.product(divisors(world), repeat=3):
        if world % (tp * cp * pp):
            continue
        dp = world // (tp * cp * pp)
        if spec.training.global_batch % dp:
            continue
        per_replica = spec.training.global_batch // dp
        shardings = [("ddp", 1), ("zero1", dp), ("zero2", dp), ("zero3", dp), ("fsdp", dp)]
        shardings += [("hsdp", s) for s in divisors(dp) if 1 < s < dp]
        for (sharding, shard), sp, b, ckpt, (sched, v), off in itertools.product(
                shardings, (False, True), divisors(per_replica), ("none", "selective", "full"),
                (("gpipe", 1), ("1f1b", 1), ("interleaved", 2)) if pp > 1 else ((None, 1),),
                ("none", "optimizer", "params")):
            lay = Layout(dp=dp, tp=tp, pp=pp, cp=cp, sharding=sharding, dp_shard=shard,  # type: ignore[arg-type]
                         sequence_parallel=sp, micro_batch=b, grad_accum_steps=per_replica // b,
                         activation_checkpointing=ckpt, pipeline_schedule=sched,  # type: ignore[arg-type]
                         virtual_stages=v, offload=off)  # type: ignore[arg-type]
            if pp > 1 and per_replica // b < pp:
                continue
            if sched == "interleaved" and (per_replica // b) % pp:
                continue
            try:
                p = estimate(spec, lay)
            except (InvalidSpec, ValueError):
                continue
            if p.fits:
                fitting += 1
                roomy = p.memory.total <= (1 - DEFAULT_MIN_FREE_FRACTION) * p.memory.gpu_memory
                if roomy and not has_gap(lay, spec.training.precision):
                    best = min(best, p.time.step_s)
    return best, fitting


@pytest.mark.slow
def test_search_finds_the_same_best_step_time_as_brute_force() -> None:
    spec = make_spec(**SMALL)
    best, fitting = brute_force_best(spec)
    chosen = plan(spec)
    assert fitting > 0 and chosen.fits
    # Within its first tier the search ranks in 0.2% buckets, then by memory: never slower than that.
    assert best <= chosen.time.step_s <= best * 1.002
    assert chosen.layout.sharding != "ddp"  # the states do not fit unsharded


def test_an_alternative_faster_than_the_chosen_layout_says_what_decided() -> None:
    p = plan(make_spec())
    assert p.fits and p.alternatives
    for alt in p.alternatives:
        if alt.step_s < p.time.step_s * 0.9995:
            assert ("near-tie" in alt.why_not or "minimum free" in alt.why_not
                    or "does not have yet" in alt.why_not), alt.why_not
    assert all(alt.fits for alt in p.alternatives)
    assert p.rejected.slower >= len(p.alternatives)
    assert p.explanation[0].startswith(p.layout.short())


def test_a_plan_is_deterministic() -> None:
    assert plan(make_spec()) == plan(make_spec())


def test_layout_pins_are_respected() -> None:
    p = plan(make_spec(layout={"tp": 2, "sharding": "zero2", "activation_checkpointing": "full"}))
    assert (p.layout.tp, p.layout.sharding, p.layout.activation_checkpointing) == (2, "zero2", "full")
    assert p.layout.sequence_parallel  # SP is free with TP: searched on
    assert all(a.layout.tp == 2 for a in p.alternatives)


def test_training_checkpointing_pins_the_search() -> None:
    p = plan(make_spec(training={"activation_checkpointing": "full"}))
    assert p.layout.activation_checkpointing == "full"


def test_nothing_fits_returns_the_closest_candidate_the_reasons_and_the_smallest_gpu_count() -> None:
    spec = make_spec(model={"preset": "llama-3.1-405b"}, training={"global_batch": 64})
    p = plan(spec)
    assert not p.fits
    assert p.reasons and p.reasons[0].startswith("closest:")
    assert p.memory.total > p.memory.gpu_memory or (p.memory.cpu_memory or 0) > (p.memory.cpu_memory_available or 0)
    assert p.min_gpus_to_fit is not None and p.min_gpus_to_fit > 8
    n = p.min_gpus_to_fit
    assert plan(make_spec(model={"preset": "llama-3.1-405b"}, training={"global_batch": 64},
                          resources={"nodes": n // 8})).fits
    assert not plan(make_spec(model={"preset": "llama-3.1-405b"}, training={"global_batch": 64},
                              resources={"nodes": n // 8 - 1})).fits


def test_rubric_places_the_run() -> None:
    assert plan(make_spec(model={"preset": "llama-tiny"}, training={"global_batch": 8})).rubric.startswith(
        "DDP fits")
    rubric_13b = plan(make_spec(model={"preset": "llama-2-13b"}, resources={"gpu": "A100-SXM-80GB"})).rubric
    assert rubric_13b.startswith("DDP does not fit (model states 194.0 GiB")  # 208.3 GB = 16 B x 13.0B
    rubric_405b = plan(make_spec(model={"preset": "llama-3.1-405b"}, resources={"nodes": 128},
                                 training={"global_batch": 512})).rubric
    assert rubric_405b.startswith("Needs tensor or pipeline parallelism")


def test_the_explanation_says_why_each_dimension_was_chosen() -> None:
    p = plan(make_spec(model={"preset": "llama-3.1-70b"}, resources={"nodes": 8}, training={"global_batch": 128}))
    text = "\n".join(p.explanation)
    for dim in ("tp=", "pp=", "sharding=", "activation_checkpointing="):
        assert dim in text
    assert "Memory:" in text and "Time per step:" in text


@pytest.mark.parametrize(("pins", "field", "needle"), [
    ({"tp": 3}, "tp", "must divide"),
    ({"tp": 16}, "tp", "allowed: 1, 2, 4, 8"),
    ({"dp": 2, "tp": 2, "pp": 1, "cp": 1}, "dp", "dp*tp*pp*cp"),
    ({"dp": 8, "micro_batch": 3}, "micro_batch", "divisible"),
    ({"pp": 64}, "pp", "layers"),
])
def test_invalid_pins_name_the_field_and_what_is_allowed(pins: dict[str, int], field: str, needle: str) -> None:
    with pytest.raises(InvalidSpec) as info:
        plan(make_spec(layout=pins))
    assert any(p.loc == ("layout", field) and needle in p.message for p in info.value.problems), info.value


def test_batch_not_divisible_by_dp_is_refused() -> None:
    with pytest.raises(InvalidSpec) as info:
        plan(make_spec(training={"global_batch": 12}, layout={"dp": 8}))
    assert any("global_batch (12)" in p.message for p in info.value.problems)


def test_unknown_gpu_lists_the_catalog() -> None:
    with pytest.raises(InvalidSpec) as info:
        plan(make_spec(resources={"gpu": "H900"}))
    problem = info.value.problems[0]
    assert problem.loc == ("resources", "gpu") and "H100-SXM-80GB" in problem.message


def test_an_inline_gpu_overrides_the_catalog_entry() -> None:
    p = plan(make_spec(resources={"gpu": {"name": "H100-SXM-80GB", "memory_gib": 94}}))
    assert p.memory.gpu_memory == 94 * 1024**3


def test_a_new_gpu_can_be_described_inline() -> None:
    p = plan(make_spec(resources={"gpu": {"name": "X1", "memory_gib": 64, "peak_tflops": {"bf16": 500}}}))
    assert p.gpu == "X1" and p.time.peak_flops_per_gpu == 500e12


def test_cpu_processes_share_the_node_memory() -> None:
    p = plan(make_spec(model={"preset": "llama-tiny"}, training={"global_batch": 8, "precision": "fp32"},
                       resources={"gpu": {"name": "cpu", "memory_gib": 16}, "gpus_per_node": 4}))
    assert p.memory.gpu_memory == 4 * 1024**3
    assert any("gloo" in w for w in p.warnings)


def test_estimate_reports_a_layout_that_does_not_fit() -> None:
    spec = make_spec(model={"preset": "llama-3.1-70b"})
    lay = Layout(dp=8, tp=1, pp=1, cp=1, sharding="ddp", dp_shard=1, sequence_parallel=False, micro_batch=1,
                 grad_accum_steps=4, activation_checkpointing="none", pipeline_schedule=None, virtual_stages=1,
                 offload="none")
    p = estimate(spec, lay)
    assert not p.fits and not p.memory.fits and p.reasons
    assert p.layout == lay


def test_estimate_refuses_a_layout_that_does_not_add_up() -> None:
    lay = Layout(dp=8, tp=1, pp=1, cp=1, sharding="fsdp", dp_shard=8, sequence_parallel=False, micro_batch=1,
                 grad_accum_steps=3, activation_checkpointing="none", pipeline_schedule=None, virtual_stages=1,
                 offload="none")
    with pytest.raises(InvalidSpec) as info:
        estimate(make_spec(), lay)
    assert info.value.problems[0].loc == ("layout", "grad_accum_steps")


def test_plan_json_has_the_contract_fields() -> None:
    data = plan(make_spec()).model_dump(mode="json")
    assert set(data["layout"]) >= {"dp", "tp", "pp", "cp", "sharding", "sequence_parallel", "micro_batch",
                                   "grad_accum_steps", "activation_checkpointing", "pipeline_schedule", "offload"}
    assert set(data["memory"]) >= {"params", "grads", "optimizer", "activations", "logits", "comm_buffers",
                                   "runtime_overhead", "allocator_margin", "total", "gpu_memory", "fits",
                                   "cpu_memory"}
    assert set(data["time"]) >= {"compute_s", "comm_exposed_s", "bubble_s", "recompute_s", "step_s",
                                 "tokens_per_s", "tokens_per_s_per_gpu", "model_flops_per_step", "mfu",
                                 "flop_convention"}
    assert set(data["comm"]) >= {"dp", "tp", "pp", "cp"}
    assert set(data["rejected"]) >= {"invalid", "out_of_memory", "slower"}
    assert {"rubric", "alternatives", "warnings", "fits"} <= set(data)
    assert all(isinstance(data["memory"][k], int) for k in ("params", "total", "gpu_memory"))


def test_pins_that_multiply_past_the_gpu_count_say_so_and_name_the_fix() -> None:
    # Each of tp=8 and pp=8 divides the 8 GPUs, but together they need 64: once reported as "no valid layout".
    with pytest.raises(InvalidSpec) as info:
        plan(make_spec(layout={"tp": 8, "pp": 8}))
    [problem] = info.value.problems
    assert problem.loc == ("layout",)
    assert problem.message.startswith("tp*pp = 8*8 = 64 is more than the 8 GPUs of the resources;")
    assert "lower tp or pp so that tp*pp divides 8" in problem.message
    assert "or give the job a multiple of 64 GPUs" in problem.message


@pytest.mark.parametrize(("pins", "resources", "needle"), [
    ({"tp": 4, "pp": 2, "cp": 2}, {},
     "tp*pp*cp = 4*2*2 = 16 is more than the 8 GPUs of the resources; lower tp, pp or cp"),
    ({"dp": 4, "tp": 4}, {}, "dp*tp = 4*4 = 16 is more than the 8 GPUs"),
    ({"tp": 4, "pp": 6}, {"gpus_per_node": 4, "nodes": 9},
     "tp*pp = 4*6 = 24 does not divide the 36 GPUs of the resources; change tp or pp so that tp*pp divides 36"),
])
def test_pins_whose_product_does_not_divide_the_gpu_count_say_so(
        pins: dict[str, int], resources: dict[str, int], needle: str) -> None:
    with pytest.raises(InvalidSpec) as info:
        plan(make_spec(layout=pins, resources=resources, training={"global_batch": 144}))
    assert any(p.loc == ("layout",) and needle in p.message for p in info.value.problems), info.value


def test_a_pin_that_does_not_divide_the_gpu_count_is_reported_once_with_the_choices() -> None:
    with pytest.raises(InvalidSpec) as info:
        plan(make_spec(layout={"tp": 3, "pp": 8}))
    assert not any(p.loc == ("layout",) for p in info.value.problems)  # no second, product-level report
    assert any(p.loc == ("layout", "tp") and "use one of 1, 2, 4, 8" in p.message for p in info.value.problems)


def test_all_four_pins_name_the_dp_that_would_fit() -> None:
    with pytest.raises(InvalidSpec) as info:
        plan(make_spec(layout={"dp": 2, "tp": 2, "pp": 1, "cp": 1}))
    assert any(p.loc == ("layout", "dp") and p.message.endswith("set dp=4, or give the job 4 GPUs")
               for p in info.value.problems), info.value


def test_pins_whose_product_divides_the_gpu_count_leave_the_rest_to_dp() -> None:
    p = plan(make_spec(layout={"tp": 2, "pp": 2}))
    assert (p.layout.dp, p.layout.tp, p.layout.pp, p.layout.cp) == (2, 2, 2, 1)


def test_the_search_builds_layouts_field_by_field() -> None:
    # Base.layout passes the fields to Layout by position (for speed): every field must land in its place.
    base = Base(mesh=Mesh(dp=2, tp=3, pp=5, cp=7), sharding="hsdp", dp_shard=11, sequence_parallel=True)
    built = base.layout(micro_batch=13, grad_accum_steps=17, activation_checkpointing="selective",
                        pipeline_schedule="interleaved", virtual_stages=19, offload="optimizer")
    assert built == Layout(dp=2, tp=3, pp=5, cp=7, sharding="hsdp", dp_shard=11, sequence_parallel=True,
                           micro_batch=13, grad_accum_steps=17, activation_checkpointing="selective",
                           pipeline_schedule="interleaved", virtual_stages=19, offload="optimizer")
    assert [f.name for f in dataclasses.fields(Layout)] == [
        "dp", "tp", "pp", "cp", "sharding", "dp_shard", "sequence_parallel", "micro_batch", "grad_accum_steps",
        "activation_checkpointing", "pipeline_schedule", "virtual_stages", "offload"]
    assert base.layout() == dataclasses.replace(built, micro_batch=1, grad_accum_steps=1,
                                                activation_checkpointing="none", pipeline_schedule=None,
                                                virtual_stages=1, offload="none")


def test_a_layouts_dict_is_all_its_fields_as_asdict_gives_them() -> None:
    """`Layout.to_dict` (what events and reports carry) is a shallow copy: it equals `dataclasses.asdict`
    for every layout the search considers, so no field may become a nested value unnoticed."""
    result = plan(make_spec(model={"preset": "llama-3.1-8b"}, resources={"gpu": "H100-SXM-80GB", "nodes": 2,
                                                                        "gpus_per_node": 8}))
    layouts = [result.layout, *(alt.layout for alt in result.alternatives)]
    assert len(layouts) > 1
    for layout in layouts:
        assert layout.to_dict() == dataclasses.asdict(layout)
