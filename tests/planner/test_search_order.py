"""The search visits meshes without context parallelism first (`search._meshes`): once a layout the
runtime runs fits, no context-parallel layout is built or timed, and the plan says so."""

from __future__ import annotations

from pathlib import Path

from service.planner import plan
from service.planner.search import SIMPLER_WITHIN
from service.spec import TrainingSpec, load_spec
from tests.support.planner import llama3_405b

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "llama3-405b-1024xh100.yaml"


def _pinned(spec: TrainingSpec, **pins: int) -> TrainingSpec:
    return TrainingSpec.model_validate({**spec.model_dump(), "layout": {**spec.layout.model_dump(), **pins}})


def test_no_context_parallel_layout_is_timed_once_a_runnable_one_fits_and_the_choice_is_unchanged() -> None:
    spec = load_spec(EXAMPLE)  # Llama 3 405B on 1,024 H100: layouts without cp fit
    p = plan(spec)
    assert p.fits and p.layout.cp == 1
    # cp > 1 cannot win while a runnable layout fits: pinning cp=1 must not change the choice.
    assert plan(_pinned(spec, cp=1)).layout == p.layout
    assert all(a.layout.cp == 1 for a in p.alternatives)
    line = next(x for x in p.explanation if x.startswith("cp=1: layouts with cp="))
    degrees = {int(d) for d in line.split("cp=")[2].split(" ")[0].split("/")}
    assert {2, 4, 8} <= degrees and "not timed" in line


def test_a_variant_fitting_without_the_minimum_free_memory_does_not_rule_out_more_recompute() -> None:
    # Llama 3 405B at 131,072 tokens on 16,384 H100 (test_llama3_405b_scale.py): fsdp tp=8 cp=16
    # with op checkpointing fits at about 96% of GPU memory, under the 10% minimum free; full
    # checkpointing recomputes more, leaves room, and is faster than any layout with pipeline
    # stages. The search once skipped it as dominated by the op variant that had fitted.
    roomy = plan(llama3_405b(131_072, {"tp": 8, "pp": 1, "cp": 16, "dp": 128, "sharding": "fsdp",
                                        "activation_checkpointing": "full"}))
    assert roomy.fits and roomy.memory.total <= 0.9 * roomy.memory.gpu_memory
    chosen = plan(llama3_405b(131_072))
    assert chosen.memory.total <= 0.9 * chosen.memory.gpu_memory
    assert chosen.time.step_s <= roomy.time.step_s * (1 + SIMPLER_WITHIN)
