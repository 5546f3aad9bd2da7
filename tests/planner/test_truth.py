"""Answers that agree with themselves and with the runtime.

Each test is one wrong answer the planner once gave: offload where it helps (one GPU included), one attention
convention for FLOPs, MFU and time, layouts the runtime accepts, and a risk-aware choice
(headroom, simplicity) that the explanation owns up to.
"""

from __future__ import annotations

import pytest

from service.planner import InvalidSpec, plan
from service.planner.hardware import CATALOG, GIB
from service.planner.runnable import is_runnable, layout_problems, runtime_gaps
from service.planner.search import SIMPLER_WITHIN
from service.planner.timing import CAUSAL_ATTENTION_SHARE
from tests.conftest import make_spec


def _one_gpu(preset: str) -> object:
    return make_spec(model={"preset": preset}, training={"global_batch": 8, "optimizer": "adamw"},
                     resources={"gpu": "H100-SXM-80GB", "gpus_per_node": 1, "nodes": 1})


def test_llama2_7b_with_adamw_fits_one_h100_by_offloading_and_says_the_runtime_cannot_run_it_yet() -> None:
    p = plan(_one_gpu("llama-2-7b"))  # type: ignore[arg-type]
    assert p.fits and p.min_gpus_to_fit is None
    assert p.layout.offload != "none" and p.memory.total <= p.memory.gpu_memory
    assert p.memory.cpu_memory and p.memory.cpu_memory <= (p.memory.cpu_memory_available or 0)
    # DDP without offload needs 16 bytes per parameter: 112 GB, more than the GPU.
    assert "DDP does not fit on 1 GPU" in p.rubric and "1 GPUs" not in p.rubric
    assert any("No layout the runtime implements fits" in line for line in p.explanation)
    assert any("offload" in w and "not implemented by the runtime" in w for w in p.warnings)


def test_llama2_70b_fits_one_gpu_with_parameter_offload() -> None:
    p = plan(_one_gpu("llama-2-70b"))  # type: ignore[arg-type]
    assert p.fits and p.layout.offload == "params"
    assert p.layout.sharding in ("zero3", "fsdp")  # offloading parameters is FSDP2's CPUOffloadPolicy
    assert not layout_problems(p.layout, precision="bf16")


def test_offload_is_only_chosen_when_nothing_the_runtime_runs_fits() -> None:
    p = plan(make_spec(model={"preset": "llama-2-7b"}))
    assert p.fits and p.layout.offload == "none" and not runtime_gaps(p.layout, precision="bf16")


def test_long_sequences_do_not_inflate_mfu_past_what_the_time_model_allows() -> None:
    # Llama-3.1-8B at 131072 tokens on 16 H100s reported 89.5% MFU: the FLOPs counted attention in
    # full while the time model charged flash attention its causal half. One convention for both,
    # so MFU can never exceed the compute-only ceiling (the GEMM efficiency the time model assumes).
    spec = make_spec(model={"preset": "llama-3.1-8b", "seq_len": 131072}, training={"global_batch": 16},
                     resources={"nodes": 2})
    p = plan(spec)
    ceiling = CATALOG["H100-SXM-80GB"].matmul_efficiency
    compute_only = p.time.model_flops_per_step / (p.time.compute_s * p.world_size * p.time.peak_flops_per_gpu)
    assert compute_only <= ceiling
    assert p.time.mfu < ceiling
    assert "causal attention" in p.time.flop_convention and "half" in p.time.flop_convention
    assert any("causal attention at half" in line for line in p.explanation)
    assert CAUSAL_ATTENTION_SHARE == 0.5


@pytest.mark.parametrize("seq_len", [2048, 8192, 32768, 131072])
def test_compute_only_mfu_stays_under_the_gemm_efficiency_at_any_sequence_length(seq_len: int) -> None:
    spec = make_spec(model={"preset": "llama-3.1-8b", "seq_len": seq_len}, training={"global_batch": 16},
                     resources={"nodes": 2})
    p = plan(spec)
    compute_only = p.time.model_flops_per_step / (p.time.compute_s * p.world_size * p.time.peak_flops_per_gpu)
    assert compute_only <= CATALOG["H100-SXM-80GB"].matmul_efficiency


@pytest.mark.parametrize("gpus", [2, 8])
def test_pinning_tensor_parallelism_never_gives_a_ddp_plan(gpus: int) -> None:
    # On 2 GPUs tp=2 leaves one data-parallel rank, where only DDP used to be searched.
    p = plan(make_spec(model={"preset": "llama-tiny"}, training={"global_batch": 8},
                       resources={"gpus_per_node": gpus}, layout={"tp": 2}))
    assert p.layout.tp == 2 and p.layout.sharding not in ("ddp", "zero1")
    assert is_runnable(p.layout, precision="bf16", shape=p.shape)
    assert all(is_runnable(a.layout, precision="bf16") or runtime_gaps(a.layout, precision="bf16")
               for a in p.alternatives)


def test_pinning_ddp_with_tensor_parallelism_is_refused_with_the_fix() -> None:
    with pytest.raises(InvalidSpec) as err:
        plan(make_spec(model={"preset": "llama-tiny"}, training={"global_batch": 8},
                       layout={"tp": 2, "sharding": "ddp"}))
    problem = err.value.problems[0]
    assert problem.path == "layout.sharding" and "fsdp" in problem.message


def test_a_layout_with_too_little_free_memory_loses_to_a_slower_one_with_room_and_the_plan_says_so() -> None:
    spec = make_spec()  # Llama-3.1-8B on 8 H100s: the fastest layout uses about 95% of the memory
    bold = plan(spec, min_free_fraction=0.0)
    careful = plan(spec)
    limit = careful.memory.gpu_memory
    assert bold.memory.total > 0.9 * limit
    assert careful.memory.total <= 0.9 * limit
    assert careful.time.step_s > bold.time.step_s
    line = next(x for x in careful.explanation if x.startswith("Headroom decided"))
    assert bold.layout.short() in line and f"{bold.memory.total / limit:.0%} of GPU memory" in line
    assert not any(x.startswith("Headroom decided") for x in bold.explanation)


def test_a_simpler_layout_wins_a_near_tie_and_the_plan_says_so() -> None:
    # A few-MB model on 2 CPU processes: ZeRO-2 and FSDP are 0.5-1% faster than DDP in the model
    # (less exposed communication, a little more compute for FSDP2's copies), within 3%.
    spec = make_spec(model={"preset": "llama-tiny"}, training={"global_batch": 8, "precision": "fp32"},
                     resources={"gpu": "cpu", "gpus_per_node": 2, "nodes": 1})
    p = plan(spec)
    assert p.layout.sharding == "ddp"
    fastest = min(p.alternatives, key=lambda a: a.step_s)
    assert fastest.step_s < p.time.step_s <= fastest.step_s * (1 + SIMPLER_WITHIN)
    line = next(x for x in p.explanation if x.startswith("Simplicity decided"))
    assert f"ddp rather than {fastest.layout.sharding}" in line and f"{SIMPLER_WITHIN:.0%} near-tie" in line


def test_the_minimum_free_fraction_is_checked() -> None:
    with pytest.raises(InvalidSpec) as err:
        plan(make_spec(), min_free_fraction=1.0)
    assert err.value.problems[0].path == "min_free_fraction"


def test_the_405b_example_comment_is_true() -> None:
    from pathlib import Path

    from service.spec import load_spec

    path = Path(__file__).resolve().parents[2] / "examples" / "llama3-405b-1024xh100.yaml"
    comment = " ".join(line.lstrip("# ") for line in path.read_text().splitlines() if line.startswith("#"))
    p = plan(load_spec(path))
    assert p.fits and "needs tensor parallelism" in comment and f"tp={p.layout.tp}" in comment and p.layout.tp > 1
    assert p.layout.pp == 1 and "Pipeline parallelism is not needed" in comment
    assert f"about {p.memory.total / GIB:.0f} GiB per GPU" in comment
    piped = [a for a in p.alternatives if a.layout.pp > 1]
    assert piped and (f"the best pipeline layout (pp={piped[0].layout.pp}) is about"
                      f" {piped[0].step_s / p.time.step_s - 1:.0%} slower") in comment


def test_the_preset_list_the_spec_schema_points_to_is_in_plan_help() -> None:
    from typer.testing import CliRunner

    from service.cli.main import app
    from service.planner.models import PRESETS
    from service.spec import spec_json_schema

    assert "shardctl plan --help" in str(spec_json_schema())  # where the schema sends a user for presets
    result = CliRunner().invoke(app, ["plan", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    assert all(name in text for name in PRESETS), text
    assert all(name in text for name in CATALOG), text
    assert "10% of GPU memory free" in text and "within 3% of the fastest" in text and "--min-free" in text


def test_min_free_on_the_command_line_changes_the_choice() -> None:
    from pathlib import Path

    from typer.testing import CliRunner

    from service.cli.main import app

    example = str(Path(__file__).resolve().parents[2] / "examples" / "llama3-70b-64xh100.yaml")
    default = CliRunner().invoke(app, ["plan", "--brief", example], env={"COLUMNS": "200"})
    bold = CliRunner().invoke(app, ["plan", "--brief", "--min-free", "0", example], env={"COLUMNS": "200"})
    assert default.exit_code == bold.exit_code == 0
    used = [float(x.output.split(" GiB")[0].split(", ")[-1].split(" / ")[0]) for x in (default, bold)]
    assert used[0] <= 0.9 * 80 < used[1]
