"""Real traces: a 2-rank gloo DDP run (captured with torch.profiler) and HTA-checked GPU traces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from service.planner.models import resolve_model
from service.profiles import analyze_traces
from service.spec import ModelSpec

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def gloo_summary():  # type: ignore[no-untyped-def]
    return analyze_traces(sorted((FIXTURES / "gloo_ddp").glob("rank-*.json.gz")))


def test_gloo_ranks_come_from_distributed_info(gloo_summary) -> None:  # type: ignore[no-untyped-def]
    assert gloo_summary.ranks_present == [0, 1]
    assert gloo_summary.backend == "gloo" and gloo_summary.world_size == 2
    assert all(r.timeline_basis == "cpu_ops" for r in gloo_summary.ranks.values())


def test_gloo_partition_sums_to_window(gloo_summary) -> None:  # type: ignore[no-untyped-def]
    for r in gloo_summary.ranks.values():
        p = r.partition
        parts = [v for k, v in p.model_dump().items() if k.endswith("_us") and k != "window_us"]
        assert sum(parts) == pytest.approx(p.window_us, abs=0.01)
        assert sum(p.pct.values()) == pytest.approx(100, abs=0.05)
        assert r.totals_us["comm"] > 0 and r.totals_us["compute"] > 0


def test_gloo_slow_loader_rank_is_the_straggler_and_input_bound(gloo_summary) -> None:  # type: ignore[no-untyped-def]
    # rank 1's dataset sleeps 30 ms per batch: it arrives last, rank 0 waits in the all-reduce
    assert gloo_summary.cross_rank.straggler.rank == 1
    r0, r1 = gloo_summary.ranks["0"], gloo_summary.ranks["1"]
    assert r1.idle.data_loader_us > 3 * 25_000
    assert r0.overlap.waiting_on_peer_us > r1.overlap.waiting_on_peer_us
    # rank 0's 3 x ~30 ms in all-reduce waiting for rank 1 is idle, not communication
    assert r0.idle.waiting_on_peer_us > 3 * 25_000 > 10_000 > r1.idle.waiting_on_peer_us
    assert r0.partition.comm_only_us < r0.idle.waiting_on_peer_us / 3
    assert "STRAGGLER" in {x.id for x in gloo_summary.diagnosis.recommendations}


def test_gloo_collective_sizes(gloo_summary) -> None:  # type: ignore[no-untyped-def]
    ar = next(c for c in gloo_summary.ranks["0"].collectives if c.op == "all_reduce")
    # the MLP 256 -> 1024 -> 1 has 264,193 fp32 parameters, one DDP bucket per step, 3 steps
    assert ar.count == 3 and ar.bytes == 3 * 264_193 * 4
    assert ar.algbw_GBps is not None and ar.algbw_GBps > 0


def test_gloo_hta_compat_is_marked_not_applicable(gloo_summary) -> None:  # type: ignore[no-untyped-def]
    h = gloo_summary.ranks["0"].hta_compat
    assert h.applicable is False and h.idle_time_pctg is None


@pytest.mark.parametrize("name", ["synthetic_gpu", "synthetic_gpu_4r", "synthetic_gpu_epoch"])
def test_hta_compat_matches_hta_exactly(name: str) -> None:
    d = FIXTURES / name
    expected = json.loads((d / "expected_hta.json").read_text())["ranks"]
    s = analyze_traces(sorted(d.glob("rank-*.json.gz")))
    assert set(s.ranks) == set(expected)
    for rank, exp in expected.items():
        got = s.ranks[rank].hta_compat.model_dump()
        for key, value in exp.items():
            if value is None:
                assert got[key] is None, (rank, key)
            else:
                assert got[key] == pytest.approx(value, abs=1e-6), (rank, key)


def test_gpu_straggler_is_the_late_rank() -> None:
    s = analyze_traces(sorted((FIXTURES / "synthetic_gpu").glob("rank-*.json.gz")))
    assert s.cross_rank.straggler is not None and s.cross_rank.straggler.rank == 1
    assert all(r.timeline_basis == "gpu_kernels" for r in s.ranks.values())
    coll = s.ranks["0"].collectives
    assert coll and all(c.bytes is not None and c.busbw_GBps is not None for c in coll)


def test_waiting_for_a_slow_peer_is_not_called_communication_bound(gloo_summary) -> None:  # type: ignore[no-untyped-def]
    # Rank 1's data loader sleeps; rank 0 sits in all-reduce waiting for it. The run is input-bound:
    # calling it communication-bound would send the user to the wrong fix.
    assert gloo_summary.diagnosis.bound == "input"
    rank0 = gloo_summary.ranks["0"]
    assert rank0.overlap.waiting_on_peer_us > 0.5 * (rank0.partition.comm_only_us + rank0.partition.comm_memory_us)
    assert "INPUT" in [r.id for r in gloo_summary.diagnosis.recommendations]


def test_traces_written_by_the_runtime_are_analysed() -> None:
    # Two gloo ranks of the shardctl runtime under a DDP plan (see fixtures/runtime_ddp/README.md).
    summary = analyze_traces(sorted((FIXTURES / "runtime_ddp").glob("rank-*.json.gz")))
    assert summary.ranks_present == [0, 1] and summary.backend == "gloo"
    for rank in summary.ranks.values():
        p = rank.partition
        parts = (p.compute_only_us + p.comm_only_us + p.memory_only_us + p.compute_comm_us + p.compute_memory_us
                 + p.comm_memory_us + p.compute_comm_memory_us + p.idle_us)
        assert abs(parts - p.window_us) <= 1e-6 * p.window_us
        (all_reduce,) = [c for c in rank.collectives if c.op == "all_reduce"]
        # DDP all-reduces every fp32 gradient once per step, in two buckets: the bytes the trace
        # carries are exactly 4 x the model's parameters (the planner's count) per analysed step.
        params = resolve_model(ModelSpec(preset="llama-tiny")).total_params
        assert all_reduce.count == 2 * len(rank.steps_analyzed) and all_reduce.group_size == 2
        assert all_reduce.bytes == 4 * params * len(rank.steps_analyzed)
        assert all_reduce.algbw_GBps is not None and all_reduce.algbw_GBps > 0
    assert summary.diagnosis.bound == "compute"  # a tiny model on CPU cores: the matmuls dominate
