"""Shared helpers for the test suite."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pytest

from service.spec import TrainingSpec

pytest_plugins = ["tests.db_fixtures", "tests.k8s.fake_cluster"]
# the shared helpers assert too: their failures read like a test's own (before any test imports them)
pytest.register_assert_rewrite("tests.support", "tests.runtime.harness")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def pytest_configure(config: pytest.Config) -> None:
    """pytest-xdist starts its workers with COLUMNS=80 and LINES=24. rich fixes a console's width at
    construction when COLUMNS is set, and the CLI builds its consoles at import, so every CLI table
    would render 80 columns wide in a worker whatever a test asks for. Without them, as in a plain
    `pytest`, a console reads COLUMNS when it prints: a test that depends on width sets it."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ.pop("COLUMNS", None)
        os.environ.pop("LINES", None)


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
