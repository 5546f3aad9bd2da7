"""The verdict: which resource bounds the run, the evidence, and the intervention that fits.

Scores are shares of the analysed window per rank, then the median over ranks:
communication = exposed comm (comm not hidden behind compute); memory = memory copies alone;
compute = any time compute runs; input = idle inside the DataLoader; host_launch = GPU idle waiting for
launches; idle = the remaining idle (synchronisation, unexplained gaps). The largest wins; if the top two
are within ``BALANCED_MARGIN`` points the run is ``balanced``.
"""

from __future__ import annotations

import statistics

from service.profiles.models import (
    Bound,
    CrossRank,
    Diagnosis,
    PlanComparison,
    RankSummary,
    Recommendation,
)
from service.profiles.stats import pct

BALANCED_MARGIN = 5.0

ADVICE = {
    "COMM_OVERLAP": "Communication is exposed and poorly overlapped: overlap it with compute "
    "(DDP bucket_cap_mb, "
    "gradient_as_bucket_view, FSDP forward/backward prefetch, async TP).",
    "COMM_VOLUME": "Communication dominates even with overlap: use fewer or larger collectives (gradient "
    "accumulation with no_sync, a larger per-GPU batch), compress gradients (bf16/fp16 hooks), "
    "keep tensor parallelism inside a node, consider a faster fabric; raise the ZeRO stage only "
    "if memory demands it.",
    "STRAGGLER": "One rank arrives last at collectives: check data skew or I/O on that rank, "
    "host contention, "
    "thermal throttling, or an uneven partition.",
    "INPUT": "The input pipeline stalls training: raise DataLoader num_workers, enable pin_memory, "
    "prefetch_factor and persistent_workers, or move augmentation to the GPU.",
    "LAUNCH": "The GPU waits for kernel launches: use CUDA graphs or torch.compile(mode='reduce-overhead'), "
    "fuse small ops, or a larger batch.",
    "SYNC": "The host synchronises with the device each step: remove .item()/.cpu()/print(loss) from the "
    "loop; use non_blocking copies from pinned memory.",
    "MEMCPY": "Memory copies are exposed: use pinned memory with non_blocking=True, keep tensors on the "
    "device, avoid device-to-host copies in the loop; if memory pressure forces offload, prefer "
    "activation checkpointing or more sharding.",
    "MEM_BW": "Compute is dominated by elementwise/reduction/copy kernels (name-based proxy, likely "
    "memory-bandwidth bound): fuse with torch.compile, use fused optimizers, channels_last, AMP.",
    "COMPUTE": "Compute-bound: the parallel layout is right; look at the top kernels and precision "
    "(AMP/bf16, TF32, FlashAttention/SDPA, larger batch).",
    "IDLE": "The device/training thread is idle without a recognised cause: look for host-side Python "
    "overhead, synchronisation and waits between steps.",
}


def _scores(r: RankSummary) -> dict[str, float]:
    """Shares of the window. Time a rank spends inside a collective waiting for a late peer is not
    communication: it is the late rank's bottleneck (often its input pipeline). The partition already
    counts it as idle (``idle.waiting_on_peer_us``); it is left out of every class here, so the late
    rank's own scores carry the verdict."""
    p, w, idle = r.partition, r.window_us, r.idle
    compute = p.compute_only_us + p.compute_comm_us + p.compute_memory_us + p.compute_comm_memory_us
    exposed = p.comm_only_us + p.comm_memory_us
    return {
        "compute": pct(compute, w),
        "communication": pct(exposed, w),
        "memory": pct(p.memory_only_us, w),
        "input": pct(idle.data_loader_us, w),
        "host_launch": pct(idle.host_wait_us + idle.kernel_wait_us, w),
        "idle": pct(idle.sync_wait_us + idle.other_us, w),
    }


def diagnose(
    ranks: list[RankSummary], cross: CrossRank, world_size: int | None, predicted_comm_fraction: float | None
) -> Diagnosis:
    per_rank = [_scores(r) for r in ranks]
    scores = {k: round(statistics.median(s[k] for s in per_rank), 2) for k in per_rank[0]}
    ordered = sorted(scores.items(), key=lambda kv: -kv[1])
    bound: Bound = ordered[0][0]  # type: ignore[assignment]
    if len(ordered) > 1 and ordered[0][1] - ordered[1][1] < BALANCED_MARGIN:
        bound = "balanced"
    evidence = [
        f"{k}: {v:.2f}% of the step window (median over {len(ranks)} rank(s))" for k, v in ordered if v > 0
    ]
    recs: list[str] = []
    overlap = statistics.median(r.overlap.comm_overlapped_by_compute_pct or 0.0 for r in ranks)
    comm_total = statistics.median(pct(r.totals_us["comm"], r.window_us) for r in ranks)
    if scores["communication"] > 20 and overlap < 50:
        recs.append("COMM_OVERLAP")
        evidence.append(
            f"exposed communication {scores['communication']:.2f}%, only {overlap:.2f}% of "
            "communication hidden behind compute"
        )
    if comm_total > 30 and (scores["communication"] > 20 or bound == "communication"):
        recs.append("COMM_VOLUME")
    if cross.straggler and (cross.straggler.arrived_last_pct >= 50 or cross.step_time_spread_pct > 10):
        recs.append("STRAGGLER")
        evidence.append(
            f"rank {cross.straggler.rank} arrived last at {cross.straggler.arrived_last_pct:.1f}% of "
            f"{cross.straggler.matched_collectives} matched collectives (mean lateness "
            f"{cross.straggler.mean_lateness_us:.0f} µs)"
        )
    if scores["input"] > 10:
        recs.append("INPUT")
    launch_small = statistics.median((r.launch.kernels_lt_10us_pct if r.launch else 0.0) for r in ranks)
    if scores["host_launch"] > 10 and (launch_small > 50 or bound == "host_launch"):
        recs.append("LAUNCH")
    sync = statistics.median(pct(r.idle.sync_wait_us, r.window_us) for r in ranks)
    if sync > 5:
        recs.append("SYNC")
    if scores["memory"] > 10:
        recs.append("MEMCPY")
    proxy = statistics.median(r.memory_bound_proxy_pct_of_compute for r in ranks)
    if bound == "compute":
        if proxy > 50:
            recs.append("MEM_BW")
            evidence.append(f"proxy: {proxy:.1f}% of compute time in elementwise/reduction/copy kernels")
        else:
            recs.append("COMPUTE")
    if bound == "idle":
        recs.append("IDLE")
    n_steps = min(len(r.steps_analyzed) for r in ranks)
    checks = [
        n_steps >= 3,
        world_size is None or len(ranks) == world_size,
        not any(
            w.startswith("backend is nccl") or w.startswith("no backend collective")
            for r in ranks
            for w in r.warnings
        ),
    ]
    confidence = "high" if all(checks) else "medium" if sum(checks) >= 2 else "low"
    plan = None
    if predicted_comm_fraction is not None:
        measured = round(scores["communication"] / 100, 4)
        delta = round(measured - predicted_comm_fraction, 4)
        verdict = "higher than" if delta > 0.05 else "lower than" if delta < -0.05 else "in line with"
        plan = PlanComparison(
            predicted_comm_fraction=predicted_comm_fraction,
            measured_comm_fraction=measured,
            delta=delta,
            text=f"measured exposed communication {measured:.1%} of the step is {verdict} the plan's "
            f"predicted {predicted_comm_fraction:.1%}",
        )
    return Diagnosis(
        bound=bound,
        scores_pct=scores,
        confidence=confidence,
        evidence=evidence,
        recommendations=[Recommendation(id=r, text=ADVICE[r]) for r in recs],
        plan=plan,
    )
