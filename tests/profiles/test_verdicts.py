"""Synthetic traces with hand-computed answers: one per bottleneck class and verdict."""

from __future__ import annotations

from pathlib import Path

import pytest
from tracebuild import TraceBuilder

from service.profiles import analyze_traces

NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n"
ELTWISE = "void at::native::vectorized_elementwise_kernel<4>(int)"


def _steps(b: TraceBuilder, n: int = 3, period: float = 200.0) -> None:
    for k in range(n):
        b.step(k + 1, k * period, period - 10)


def _compute_bound(tmp_path: Path) -> Path:
    b = TraceBuilder()
    _steps(b)
    for k in range(3):
        o = k * 200
        b.kernel(GEMM, o + 10, 80)
        b.kernel(NCCL, o + 30, 20, stream=21)
        b.kernel(ELTWISE, o + 95, 15, launch_ts=o + 90)
    return b.write(tmp_path / "compute.json")


def test_compute_bound_partition_overlap_and_verdict(tmp_path: Path) -> None:
    s = analyze_traces([_compute_bound(tmp_path)])
    r = s.ranks["0"]
    # each device window is [10, 110): gemm 80 (20 of it under NCCL), elementwise 15, a 5 µs gap
    assert r.steps_analyzed == [1, 2, 3]
    assert [st.duration_us for st in r.per_step] == [100.0, 100.0, 100.0]
    p = r.partition
    assert (p.compute_only_us, p.compute_comm_us, p.comm_only_us, p.idle_us) == (225.0, 60.0, 0.0, 15.0)
    assert r.overlap.comm_overlapped_by_compute_pct == 100.0
    assert r.idle.kernel_wait_us == 15.0  # gaps < 30 µs with the next kernel already launched
    assert s.diagnosis.bound == "compute"
    assert [x.id for x in s.diagnosis.recommendations] == ["COMPUTE"]
    assert r.top_items[0].name == GEMM and r.top_items[0].count == 3 and r.top_items[0].total_us == 240.0
    assert r.launch is not None and r.launch.n_launches == 9


def test_hta_compat_uses_kernel_span_and_drops_last_step(tmp_path: Path) -> None:
    h = analyze_traces([_compute_bound(tmp_path)]).ranks["0"].hta_compat
    # HTA drops step 3; span of steps 1-2 is [10, 310) = 300 µs with 2 x 95 µs busy
    assert h.last_step_dropped
    assert (h.kernel_time_us, h.idle_time_us, h.compute_time_us, h.non_compute_time_us) == (300, 110, 190, 0)
    assert (h.idle_time_pctg, h.compute_time_pctg, h.non_compute_time_pctg) == (36.67, 63.33, 0.0)
    assert h.comm_comp_overlap_pctg == 100.0


def test_hta_drops_the_last_step_when_the_ranks_together_name_two(tmp_path: Path) -> None:
    """HTA decides over all ranks: one step name per rank is one symbol alone, two together."""
    paths = []
    for rank in (0, 1):
        b = TraceBuilder(rank=rank, world=2)
        b.step(rank + 1, 0, 1_000)  # rank 0 holds ProfilerStep#1, rank 1 ProfilerStep#2
        b.kernel(GEMM, 100, 50).kernel(GEMM, 2_000, 50)  # the second kernel is launched after the step
        paths.append(b.write(tmp_path / f"rank-{rank}.json"))
    alone = analyze_traces(paths[:1]).ranks["0"].hta_compat
    assert not alone.last_step_dropped and alone.kernel_time_us == 1_950
    together = analyze_traces(paths)
    for rank in ("0", "1"):
        h = together.ranks[rank].hta_compat
        # HTA keeps CPU rows before the last step's start and the kernels they launched: none here
        # (both steps start at 0), so nothing with a GPU stream is left.
        assert h.last_step_dropped and not h.applicable


def test_hta_compat_stays_exact_at_unix_microsecond_timestamps(tmp_path: Path) -> None:
    """Real traces stamp events in µs since the epoch (~1.7e15). Summing 4,000 such ends as floats
    passes 2**53 and loses whole microseconds; HTA shifts time to 0 first, so its sums are exact."""
    t0 = 1_732_000_000_000_000
    b = TraceBuilder()
    b.step(1, t0, 40_000).step(2, t0 + 40_000, 10)
    for k in range(4_000):  # 4 µs kernels every 10 µs: 6 µs idle between neighbours
        b.kernel(GEMM, t0 + 10 * k, 4)
    h = analyze_traces([b.write(tmp_path / "epoch.json")]).ranks["0"].hta_compat
    assert h.kernel_time_us == 10 * 3_999 + 4
    assert (h.compute_time_us, h.idle_time_us) == (4 * 4_000, 6 * 3_999)
    assert h.idle_time_pctg == 59.99


def test_communication_bound(tmp_path: Path) -> None:
    b = TraceBuilder()
    _steps(b)
    for k in range(3):
        b.kernel(GEMM, k * 200 + 10, 20).kernel(NCCL, k * 200 + 30, 80, stream=21)
    s = analyze_traces([b.write(tmp_path / "comm.json")])
    r = s.ranks["0"]
    assert r.partition.pct["comm_only"] == 80.0 and r.partition.pct["compute_only"] == 20.0
    assert r.overlap.comm_overlapped_by_compute_pct == 0.0
    assert s.diagnosis.bound == "communication"
    assert {"COMM_OVERLAP", "COMM_VOLUME"} <= {x.id for x in s.diagnosis.recommendations}
    # HTA 0.5.0 sees ncclDevKernel_* as communication too (^nccl.*Kernel), and counts it as non-compute
    assert r.hta_compat.non_compute_time_pctg is not None and r.hta_compat.non_compute_time_pctg > 0


def test_memory_bound(tmp_path: Path) -> None:
    b = TraceBuilder()
    _steps(b)
    for k in range(3):
        b.kernel(GEMM, k * 200 + 10, 20).kernel(
            "Memcpy HtoD (Pageable -> Device)", k * 200 + 30, 70, cat="gpu_memcpy"
        )
    s = analyze_traces([b.write(tmp_path / "mem.json")])
    assert s.ranks["0"].partition.memory_only_us == 210.0
    assert s.diagnosis.bound == "memory"
    assert "MEMCPY" in {x.id for x in s.diagnosis.recommendations}


def test_host_launch_bound(tmp_path: Path) -> None:
    b = TraceBuilder()
    _steps(b)
    for k in range(3):
        o = k * 200
        b.kernel(ELTWISE, o + 10, 2, launch_ts=o + 5)
        for j in range(1, 4):  # launched only after the GPU drained: host wait
            b.kernel(ELTWISE, o + 10 + 30 * j, 2, launch_ts=o + 10 + 30 * j - 5)
    s = analyze_traces([b.write(tmp_path / "launch.json")])
    r = s.ranks["0"]
    assert r.partition.window_us == 3 * 92.0
    assert r.idle.host_wait_us == 3 * 84.0
    assert s.diagnosis.bound == "host_launch"
    assert "LAUNCH" in {x.id for x in s.diagnosis.recommendations}


def test_input_bound_cpu_trace(tmp_path: Path) -> None:
    b = TraceBuilder(backend="gloo")
    for k in range(3):
        o = k * 100
        b.step(k + 1, o, 100)
        b.cpu("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", o, 60, cat="user_annotation")
        b.cpu("aten::mm", o + 60, 30)
        b.cpu(
            "gloo:all_reduce",
            o + 90,
            5,
            cat="user_annotation",
            tid=2,
            args={"Input Dims": [[1000]], "Input type": ["float"]},
        )
        b.cpu("aten::add", o + 95, 5)
    s = analyze_traces([b.write(tmp_path / "input.json")])
    r = s.ranks["0"]
    assert r.timeline_basis == "cpu_ops"
    p = r.partition
    assert (p.compute_only_us, p.comm_only_us, p.idle_us) == (105.0, 15.0, 180.0)
    assert r.idle.data_loader_us == 180.0
    assert s.diagnosis.bound == "input"
    assert "INPUT" in {x.id for x in s.diagnosis.recommendations}
    (c,) = r.collectives
    assert (c.op, c.count, c.bytes) == ("all_reduce", 3, 3 * 4000)
    assert c.algbw_GBps == round(12000 / (15 * 1e3), 4)
    assert r.hta_compat.applicable is False


def test_balanced_when_top_two_are_close(tmp_path: Path) -> None:
    b = TraceBuilder()
    _steps(b)
    for k in range(3):
        b.kernel(GEMM, k * 200 + 10, 50).kernel(NCCL, k * 200 + 60, 48, stream=21)
    assert analyze_traces([b.write(tmp_path / "bal.json")]).diagnosis.bound == "balanced"


@pytest.mark.parametrize(
    ("predicted", "word"), [(0.2, "higher than"), (0.8, "in line with"), (0.95, "lower than")]
)
def test_plan_comparison(tmp_path: Path, predicted: float, word: str) -> None:
    b = TraceBuilder()
    _steps(b)
    for k in range(3):
        b.kernel(GEMM, k * 200 + 10, 20).kernel(NCCL, k * 200 + 30, 80, stream=21)
    plan = analyze_traces([b.write(tmp_path / "c.json")], predicted_comm_fraction=predicted).diagnosis.plan
    assert plan is not None and plan.measured_comm_fraction == 0.8
    assert word in plan.text


def test_partition_sums_to_window_for_every_step(tmp_path: Path) -> None:
    s = analyze_traces([_compute_bound(tmp_path)])
    for st in s.ranks["0"].per_step:
        parts = st.partition.model_dump()
        total = sum(v for k, v in parts.items() if k.endswith("_us") and k != "window_us")
        assert total == pytest.approx(st.duration_us, abs=1e-6)



def test_waiting_for_a_late_peer_is_idle_not_communication(tmp_path: Path) -> None:
    """Rank 1 computes 120 µs before the all-reduce, rank 0 only 50: rank 0 enters at 50 and waits
    70 µs for rank 1. Both leave at 150, so rank 0's all-reduce lasts 100 µs and rank 1's 30."""
    paths = []
    for rank, gemm_us in ((0, 50), (1, 120)):
        b = TraceBuilder(rank=rank, world=2)
        b.step(1, -10, 200)
        b.kernel(GEMM, 0, gemm_us).kernel(NCCL, gemm_us, 150 - gemm_us, stream=21)
        paths.append(b.write(tmp_path / f"rank-{rank}.json"))
    s = analyze_traces(paths)
    r0, r1 = s.ranks["0"], s.ranks["1"]
    assert r0.overlap.waiting_on_peer_us == 70 and r1.overlap.waiting_on_peer_us == 0
    p0 = r0.partition
    assert (p0.window_us, p0.compute_only_us, p0.comm_only_us, p0.idle_us) == (150, 50, 30, 70)
    assert r0.idle.waiting_on_peer_us == 70 and r0.overlap.exposed_comm_us == 30
    assert sum(v for k, v in p0.pct.items()) == pytest.approx(100, abs=0.05)
    p1 = r1.partition
    assert (p1.compute_only_us, p1.comm_only_us, p1.idle_us) == (120, 30, 0)
    assert s.cross_rank.straggler is not None and s.cross_rank.straggler.rank == 1
    # exposed communication is 20 % on both ranks: compute (33 % and 80 %) bounds the run
    assert s.diagnosis.scores_pct["communication"] == 20.0 and s.diagnosis.bound == "compute"
