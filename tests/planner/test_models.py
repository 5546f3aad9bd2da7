"""Parameter counting against published model sizes and the Megatron formula."""

from __future__ import annotations

import pytest

from service.planner import InvalidSpec
from service.planner.layout import Layout
from service.planner.memory import stage_params
from service.planner.models import PRESETS, resolve_model
from service.spec import ModelSpec

# Parameter counts the model cards publish (Hugging Face `num_parameters()`).
PUBLISHED = {
    "llama-2-7b": 6_738_415_616,
    "llama-2-13b": 13_015_864_320,
    "llama-2-70b": 68_976_648_192,
    "llama-3.1-8b": 8_030_261_248,
    "llama-3.1-70b": 70_553_706_496,
    "llama-3.1-405b": 405_853_388_800,
}


@pytest.mark.parametrize(("preset", "count"), PUBLISHED.items())
def test_llama_presets_count_exactly_the_published_parameters(preset: str, count: int) -> None:
    assert resolve_model(ModelSpec(preset=preset)).total_params == count


@pytest.mark.parametrize("preset", ["gpt3-175b", "gpt-1t"])
def test_gpt_presets_follow_narayanan_eq2(preset: str) -> None:
    # P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h)); Eq. 2 leaves out the final LayerNorm (2h).
    shape = resolve_model(ModelSpec(preset=preset))
    n, h, v, s = shape.layers, shape.hidden, shape.vocab, shape.seq_len
    eq2 = 12 * n * h * h * (1 + 13 / (12 * h) + (v + s) / (12 * n * h))
    assert shape.total_params - 2 * h == pytest.approx(eq2, rel=1e-12)


def test_gpt3_is_175b_and_the_1t_model_is_1t() -> None:
    assert resolve_model(ModelSpec(preset="gpt3-175b")).total_params == pytest.approx(175e9, rel=0.01)
    assert resolve_model(ModelSpec(preset="gpt-1t")).total_params == pytest.approx(1.008e12, rel=0.001)


def test_explicit_fields_override_the_preset() -> None:
    base = resolve_model(ModelSpec(preset="llama-3.1-8b"))
    longer = resolve_model(ModelSpec(preset="llama-3.1-8b", seq_len=2048, layers=16))
    assert (longer.seq_len, longer.layers) == (2048, 16)
    assert longer.total_params == pytest.approx(
        base.total_params - 16 * base.layer_params)


def test_params_scales_every_part_of_the_counted_architecture() -> None:
    shape = resolve_model(ModelSpec(preset="llama-2-7b", params=7e9))
    base = resolve_model(ModelSpec(preset="llama-2-7b"))
    assert shape.total_params == pytest.approx(7e9)
    assert shape.embedding_params / shape.total_params == pytest.approx(base.embedding_params / base.total_params)


def test_gqa_and_swiglu_shapes_are_counted() -> None:
    shape = resolve_model(ModelSpec(preset="llama-3.1-70b"))
    h, kv = 8192, 8 * 128
    assert shape.layer_matmul_params == 2 * h * h + 2 * h * kv + 3 * h * 28672
    # The largest unit FSDP gathers: Llama 3's 128k-vocabulary embedding outweighs a 70B block,
    # a 405B block outweighs the embedding.
    one_rank = Layout(dp=8, tp=1, pp=1, cp=1, sharding="fsdp", dp_shard=8, sequence_parallel=False, micro_batch=1,
                      grad_accum_steps=1, activation_checkpointing="none", pipeline_schedule=None, virtual_stages=1,
                      offload="none")
    assert stage_params(shape, one_rank).largest_unit == shape.embedding_params == 128256 * h
    big = resolve_model(ModelSpec(preset="llama-3.1-405b"))
    assert stage_params(big, one_rank).largest_unit == big.layer_params


def test_unknown_preset_names_the_field_and_lists_the_choices() -> None:
    with pytest.raises(InvalidSpec) as info:
        resolve_model(ModelSpec(preset="llama-9"))
    problem = info.value.problems[0]
    assert problem.loc == ("model", "preset")
    assert "llama-3.1-8b" in problem.message


def test_params_alone_is_refused_with_the_missing_fields() -> None:
    with pytest.raises(InvalidSpec) as info:
        resolve_model(ModelSpec(params=7e9))
    assert {p.loc[-1] for p in info.value.problems} == {"layers", "hidden", "heads", "vocab", "seq_len"}


def test_params_far_from_the_architecture_is_refused() -> None:
    with pytest.raises(InvalidSpec) as info:
        resolve_model(ModelSpec(preset="llama-3.1-8b", params=70e9))
    assert info.value.problems[0].loc == ("model", "params")


def test_every_preset_resolves() -> None:
    for name in PRESETS:
        assert resolve_model(ModelSpec(preset=name)).total_params > 0
