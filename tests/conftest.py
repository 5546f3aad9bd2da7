"""Shared helpers for the test suite."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from service.spec import TrainingSpec

pytest_plugins = ["tests.db_fixtures", "tests.k8s.fake_cluster"]

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"

BASE_SPEC: dict[str, Any] = {
    "name": "test-spec",
    "model": {"preset": "llama-3.1-8b"},
    "training": {"global_batch": 32, "precision": "bf16", "optimizer": "adamw"},
    "resources": {"gpu": "H100-SXM-80GB", "gpus_per_node": 8, "nodes": 1},
}


def deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def make_spec(**sections: Any) -> TrainingSpec:
    """BASE_SPEC with sections merged in, e.g. make_spec(model={"preset": "llama-2-13b"})."""
    return TrainingSpec.model_validate(deep_merge(BASE_SPEC, sections))


@pytest.fixture
def spec_factory():
    return make_spec
