"""Planning at 1,000+ GPUs against Meta's published Llama 3 405B layout.

Dubey et al., "The Llama 3 Herd of Models" (2024), Table 4: on 16,384 H100s with 16M tokens per
step, tp=8, pp=16 and cp=1, dp=128 at 8,192 tokens per sequence (41% BF16 MFU), and tp=8, pp=16,
cp=16, dp=8 at 131,072 (38%); interleaved pipeline schedule, no activation checkpointing at 8K.

What the planner does with that cluster and spec, and why it differs from Meta (stated, not hidden):

- It keeps Meta's tensor and context parallelism inside their bounds: tensor parallelism inside a
  node, cp=1 at 8K and cp>1 at 131K, where context parallelism is the only way to fit (the runtime
  does not run cp yet, so that plan is in the runtime-gap tier and says so). At 8K it is Meta's
  tp=8. At 131K it is tp=4 with cp=32: since a cross-node collective gets one NIC per rank of its
  group in each node (`Cluster.collective_gbps`), the FSDP group of tp=4 (2 ranks per node) moves
  its gathers twice as fast as tp=8's, and op-level checkpointing fits at tp=4 (64 of 80 GiB) where
  at tp=8 it leaves too little free memory (77 GiB), so tp=8 needs full checkpointing, which
  replays the attention that dominates at 131K tokens (about 26% slower in the model).
- It chooses fewer pipeline stages than Meta's 16: pp=1 at 8K (full checkpointing) and at 131K
  (FSDP over dp x cp leaves a 405B model room without a pipeline, and a fully sharded pipeline
  stage keeps its parameters and fp32 gradients whole across its micro-batches,
  `memory.model_state_bytes`, so a few large stages cost more memory than they save). Its memory
  model gives Meta's layout without checkpointing about 107 GiB per GPU even with the parameters
  offloaded (1F1B; 77 GiB of activations, and the stage's unsharded bf16 parameters and fp32
  gradients stay on the GPU; interleaving adds in-flight micro-batches); Meta fitted it in 80 GiB
  with balancing the planner does not model (one layer fewer on the first and last stages, stage
  inputs and outputs freed early). With checkpointing the activations no longer bind, and fewer
  stages mean less bubble, so the test does not pin pp for the free choice.
- For Meta's mesh it predicts about 22% MFU at 8K and 21% at 131K against the published 41% and
  38%: the model charges recompute (Meta had none at 8K), more exposed data-parallel
  communication than Meta's overlapped run shows, and at 131K flash attention at
  FlashAttention-2's efficiency on H100 (Meta ran its own attention kernels). The test holds the
  prediction to between half and 1.1 times the published figure, a band that catches the model
  getting worse; it is not evidence of accuracy at this scale (benchmarks/prediction_error.py is
  where that is measured).
"""

from __future__ import annotations

import pytest

from service.planner import plan
from service.planner.result import Plan
from tests.support.planner import GPUS, llama3_405b

# seq_len -> (published mesh, published MFU)
PUBLISHED: dict[int, tuple[dict[str, int], float]] = {
    8_192: ({"tp": 8, "pp": 16, "cp": 1, "dp": 128}, 0.41),
    131_072: ({"tp": 8, "pp": 16, "cp": 16, "dp": 8}, 0.38),
}
MFU_BAND = (0.5, 1.1)  # predicted / published MFU for the published mesh, see the module doc


def _bubble_matches_the_interleaved_formula(p: Plan) -> None:
    """Bubble = (pp-1)/(v*m) of the per-micro-batch compute and recompute, m micro-batches."""
    lay = p.layout
    m, v = lay.grad_accum_steps, lay.virtual_stages
    expected = (lay.pp - 1) / (v * m) * (p.time.compute_s + p.time.recompute_s)
    assert p.time.bubble_s == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("seq_len", sorted(PUBLISHED))
def test_the_planner_keeps_meta_s_tensor_and_context_parallelism(seq_len: int) -> None:
    p = plan(llama3_405b(seq_len))
    lay = p.layout
    assert p.fits and p.world_size == GPUS
    assert lay.tp > 1 and 8 % lay.tp == 0  # tensor parallelism inside a node, never across
    if seq_len == 8_192:
        assert lay.tp == 8
        assert lay.cp == 1 and p.comm.cp == 0
    else:
        assert lay.cp > 1
        assert p.comm.cp > 0  # ring attention's K/V traffic is charged
        assert any("needs cp" in line for line in p.explanation)
    if lay.pp > 1:
        _bubble_matches_the_interleaved_formula(p)


@pytest.mark.parametrize("seq_len", sorted(PUBLISHED))
def test_meta_s_published_mesh_fits_and_its_mfu_is_within_the_stated_band(seq_len: int) -> None:
    mesh, published_mfu = PUBLISHED[seq_len]
    p = plan(llama3_405b(seq_len, mesh))
    lay = p.layout
    assert (lay.tp, lay.pp, lay.cp, lay.dp) == (mesh["tp"], mesh["pp"], mesh["cp"], mesh["dp"])
    assert p.fits
    assert MFU_BAND[0] * published_mfu <= p.time.mfu <= MFU_BAND[1] * published_mfu, p.time.mfu
    # With 16 stages the search prefers interleaving: it pays v times the point-to-point traffic
    # to divide the bubble by v.
    assert lay.pipeline_schedule == "interleaved" and lay.virtual_stages > 1
    _bubble_matches_the_interleaved_formula(p)
    one_f_one_b = plan(llama3_405b(seq_len, {**mesh, "pipeline_schedule": "1f1b",
                                             "micro_batch": lay.micro_batch,
                                             "activation_checkpointing": lay.activation_checkpointing}))
    assert one_f_one_b.fits and one_f_one_b.layout.grad_accum_steps == lay.grad_accum_steps
    assert p.comm.pp == pytest.approx(lay.virtual_stages * one_f_one_b.comm.pp, rel=0.01)
    assert p.time.bubble_s < one_f_one_b.time.bubble_s
