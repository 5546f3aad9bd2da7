"""Small specs the API tests submit (they plan in milliseconds)."""

from __future__ import annotations

from typing import Any

from tests.conftest import deep_merge

TINY: dict[str, Any] = {
    "name": "tiny",
    "model": {"preset": "llama-tiny"},
    "training": {"global_batch": 8, "precision": "fp32", "steps": 5},
    "resources": {"gpu": "cpu", "gpus_per_node": 2, "nodes": 1},
}


def tiny(**sections: Any) -> dict[str, Any]:
    return deep_merge(TINY, sections)
