"""Planner inputs the planner tests share: a `Layout` with defaults, and Meta's Llama 3 405B training
spec on 16,384 H100s (Dubey et al. 2024, Table 4: 16M tokens per step)."""

from __future__ import annotations

from collections.abc import Mapping

from service.planner import Layout
from service.spec import TrainingSpec

GPUS = 16_384
TOKENS_PER_STEP = 16 * 2**20


def layout(**kw: object) -> Layout:
    fields: dict[str, object] = {
        "dp": 8, "tp": 1, "pp": 1, "cp": 1, "sharding": "fsdp", "dp_shard": 8, "sequence_parallel": False,
        "micro_batch": 1, "grad_accum_steps": 4, "activation_checkpointing": "none",
        "pipeline_schedule": None, "virtual_stages": 1, "offload": "none"}
    fields.update(kw)
    return Layout(**fields)  # type: ignore[arg-type]


def llama3_405b(seq_len: int, layout: Mapping[str, object] | None = None) -> TrainingSpec:
    return TrainingSpec.model_validate({
        "name": "llama3-405b",
        "model": {"preset": "llama-3.1-405b", "seq_len": seq_len},
        "training": {"global_batch": TOKENS_PER_STEP // seq_len, "precision": "bf16"},
        "resources": {"gpu": "H100-SXM-80GB", "gpus_per_node": 8, "nodes": GPUS // 8},
        "layout": layout or {},
    })
