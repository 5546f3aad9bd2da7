"""The input contract: loading, validation messages and the JSON Schema."""

from __future__ import annotations

import json
from pathlib import Path

import pydantic
import pytest

from service.spec import TrainingSpec, load_spec, parse_spec_text, spec_json_schema
from tests.conftest import BASE_SPEC, EXAMPLES, deep_merge

ISSUE_EXAMPLE = """
name: llama3-8b-pretrain
model:
  preset: llama-3.1-8b
  params: 8.03e9
  layers: 32
  hidden: 4096
  heads: 32
  kv_heads: 8
  ffn_hidden: 14336
  vocab: 128256
  seq_len: 8192
  mlp: swiglu
  norm: rmsnorm
  dropout: 0.0
  tied_embeddings: false
training:
  global_batch: 16
  precision: bf16
  optimizer: adamw
  activation_checkpointing: auto
  attention: flash
  steps: 100
resources:
  gpu: H100-SXM-80GB
  gpus_per_node: 8
  nodes: 1
  intra_node_gbps: 450
  inter_node_gbps: 50
layout:
  dp: 8
  tp: 1
  pp: 1
  cp: 1
  sharding: fsdp
  sequence_parallel: false
  micro_batch: 2
  activation_checkpointing: selective
  pipeline_schedule: 1f1b
  virtual_stages: 1
  offload: none
"""


def errors(data: dict) -> list[tuple[str, str]]:  # type: ignore[type-arg]
    with pytest.raises(pydantic.ValidationError) as info:
        TrainingSpec.model_validate(data)
    return [(".".join(str(p) for p in e["loc"]), e["msg"]) for e in info.value.errors()]


def test_the_issue_example_loads_with_every_field() -> None:
    spec = parse_spec_text(ISSUE_EXAMPLE)
    assert spec.model.kv_heads == 8 and spec.layout.sharding == "fsdp" and spec.resources.world_size == 8


def test_json_and_yaml_files_load_the_same(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text(json.dumps(BASE_SPEC))
    (tmp_path / "a.yaml").write_text(json.dumps(BASE_SPEC))
    assert load_spec(tmp_path / "a.json") == load_spec(tmp_path / "a.yaml")


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_bundled_examples_are_valid(path: Path) -> None:
    assert load_spec(path).name


def test_unknown_keys_are_errors_that_name_the_key() -> None:
    assert errors(deep_merge(BASE_SPEC, {"training": {"global_bach": 16}})) == [
        ("training.global_bach", "Extra inputs are not permitted")]


@pytest.mark.parametrize(("section", "field", "value"), [
    ("model", "layers", -4), ("model", "hidden", 0), ("training", "global_batch", 0),
    ("resources", "gpus_per_node", -1), ("resources", "nodes", 0),
])
def test_non_positive_sizes_name_the_field(section: str, field: str, value: int) -> None:
    found = errors(deep_merge(BASE_SPEC, {section: {field: value}}))
    assert found[0][0] == f"{section}.{field}" and "greater than 0" in found[0][1]


def test_enums_say_what_is_allowed() -> None:
    found = errors(deep_merge(BASE_SPEC, {"training": {"precision": "int4"}}))
    assert found[0][0] == "training.precision" and "'bf16'" in found[0][1]


def test_hidden_must_divide_by_heads() -> None:
    found = errors(deep_merge(BASE_SPEC, {"model": {"hidden": 1000, "heads": 3}}))
    assert "hidden (1000) must be divisible by model.heads (3)" in found[0][1]


def test_nodes_and_gpus_must_agree() -> None:
    found = errors(deep_merge(BASE_SPEC, {"resources": {"nodes": 2, "gpus": 8}}))
    assert "give either nodes or gpus" in found[0][1]


def test_sequence_parallel_needs_tp() -> None:
    found = errors(deep_merge(BASE_SPEC, {"layout": {"tp": 1, "sequence_parallel": True}}))
    assert "sequence_parallel needs layout.tp > 1" in found[0][1]


def test_param_offload_needs_full_sharding() -> None:
    found = errors(deep_merge(BASE_SPEC, {"layout": {"sharding": "zero1", "offload": "params"}}))
    assert "zero3, fsdp or hsdp" in found[0][1]


def test_checkpointing_set_twice_must_agree() -> None:
    found = errors(deep_merge(BASE_SPEC, {"training": {"activation_checkpointing": "full"},
                                          "layout": {"activation_checkpointing": "none"}}))
    assert "contradicts" in found[0][1]


def test_gpus_gives_the_world_size() -> None:
    spec = TrainingSpec.model_validate(deep_merge(BASE_SPEC, {"resources": {"nodes": None, "gpus": 32}}))
    assert (spec.resources.world_size, spec.resources.node_count) == (32, 4)


def test_text_that_is_not_a_mapping_is_refused() -> None:
    with pytest.raises(ValueError, match="must be a mapping"):
        parse_spec_text("- just\n- a list\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        parse_spec_text("name: [unclosed")


def test_json_schema_documents_the_contract() -> None:
    schema = spec_json_schema()
    assert set(schema["required"]) == {"name", "model", "training", "resources"}
    assert {"ModelSpec", "TrainingConfig", "Resources", "LayoutPins"} <= set(schema["$defs"])
