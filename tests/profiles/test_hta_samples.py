"""HTA's own public GPU traces (copied from HolisticTraceAnalysis' tests/data, see fixtures/hta_samples):
``hta_compat`` must give HTA 0.5.0's figures exactly. The expected values were computed by HTA itself
with ``fixtures/hta_expected.py`` (its docstring has the command); HTA is not a dependency."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from service.profiles import analyze_traces

SAMPLES = Path(__file__).parent / "fixtures" / "hta_samples"


@pytest.mark.parametrize("name", ["trace_filter_2ranks", "nccl_parser_config_rank0"])
def test_hta_compat_matches_hta_on_its_own_sample_traces(name: str) -> None:
    d = SAMPLES / name
    expected = json.loads((d / "expected_hta.json").read_text())["ranks"]
    summary = analyze_traces(sorted(d.glob("*.json.gz")))
    assert set(summary.ranks) == set(expected)
    for rank, exp in expected.items():
        got = summary.ranks[rank].hta_compat.model_dump()
        assert got["applicable"] is True and got["last_step_dropped"] is True
        for key, value in exp.items():
            assert got[key] == value, (name, rank, key)


def test_real_nccl_traces_get_a_gpu_timeline_with_sized_collectives() -> None:
    summary = analyze_traces(sorted((SAMPLES / "trace_filter_2ranks").glob("*.json.gz")))
    assert summary.backend == "nccl" and summary.ranks_present == [0, 1]
    for rank in summary.ranks.values():
        assert rank.timeline_basis == "gpu_kernels"
        p = rank.partition
        parts = (p.compute_only_us + p.comm_only_us + p.memory_only_us + p.compute_comm_us + p.compute_memory_us
                 + p.comm_memory_us + p.compute_comm_memory_us + p.idle_us)
        assert parts == pytest.approx(p.window_us, rel=1e-6)
        assert rank.totals_us["comm"] > 0 and rank.totals_us["compute"] > 0
