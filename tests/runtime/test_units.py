"""In-process checks of the runtime's pieces (no process group needed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from service.jobenv import JobEnv, MeasurementKind
from service.planner import plan
from service.planner.models import resolve_model
from service.spec import ModelSpec, TrainingSpec
from tests.runtime.harness import ROOT, TINY_MODEL, env, layout, make_case, report, spec_dict
from workers.runtime import Decoder, UnsupportedLayout
from workers.runtime.__main__ import _plan
from workers.runtime.config import PlanNotRunnable, RunOptions, resolve_run
from workers.runtime.data import global_batch, local_batch
from workers.runtime.model import keep_stage, stage_layers
from workers.runtime.parallelize import check_supported
from workers.runtime.report import ApiReporter


@pytest.mark.parametrize("model", [TINY_MODEL, {"preset": "llama-tiny"}])
def test_reference_decoder_has_exactly_the_planners_parameter_count(model: dict[str, object]) -> None:
    shape = resolve_model(ModelSpec.model_validate(model))
    decoder = Decoder(shape)
    assert sum(p.numel() for p in decoder.parameters()) == shape.total_params
    norms = sum(p.numel() for n, p in decoder.named_parameters() if n.startswith("layers.0.") and p.dim() == 1)
    assert norms == shape.layer_norm_params


def test_decoder_refuses_shapes_it_cannot_build() -> None:
    shape = resolve_model(ModelSpec(preset="gpt3-175b"))
    with pytest.raises(ValueError, match=r"model\.mlp=gelu"):
        Decoder(shape)


def test_pipeline_stages_split_layers_evenly_and_keep_their_names() -> None:
    shape = resolve_model(ModelSpec.model_validate({**TINY_MODEL, "layers": 5}))
    parts = []
    for stage in range(2):
        torch.manual_seed(0)
        m = Decoder(shape)
        parts.append((keep_stage(m, stage, 2), m))
    assert [kept for kept, _ in parts] == [[0, 1, 2], [3, 4]]
    first, last = parts[0][1], parts[1][1]
    assert first.tok_embeddings is not None and first.output is None
    assert last.tok_embeddings is None and last.output is not None and list(last.layers) == ["3", "4"]
    # Stages chained give the full model's output.
    torch.manual_seed(0)
    full = Decoder(shape)
    tokens = torch.randint(0, shape.vocab, (2, shape.seq_len))
    torch.testing.assert_close(last(first(tokens)), full(tokens))
    # Every stage the planner allows (stages <= layers) gets a layer; the busiest has ceil(L/S).
    assert [stage_layers(6, s, 4) for s in range(4)] == [[0, 1], [2, 3], [4], [5]]
    assert [stage_layers(4, s, 3) for s in range(3)] == [[0, 1], [2], [3]]
    for layers in range(1, 40):
        for stages in range(1, layers + 1):
            split = [stage_layers(layers, s, stages) for s in range(stages)]
            assert [i for part in split for i in part] == list(range(layers)) and all(split)
            assert max(map(len, split)) == -(-layers // stages)
    with pytest.raises(ValueError, match=r"layout\.pp=5"):
        keep_stage(Decoder(resolve_model(ModelSpec.model_validate(TINY_MODEL))), 4, 5)


@pytest.mark.parametrize(("fields", "precision", "field"), [
    ({"sharding": "ddp", "tp": 2}, "fp32", "sharding"),
    ({"sharding": "zero1", "tp": 2}, "fp32", "sharding"),
    ({"sharding": "fsdp", "pp": 2, "schedule": "1f1b"}, "fp16", "pp"),
    ({"sharding": "fsdp"}, "fp8", "precision"),
])
def test_unsupported_layouts_fail_before_training_naming_the_field(fields: dict[str, object], precision: str,
                                                                    field: str) -> None:
    with pytest.raises(UnsupportedLayout) as info:
        check_supported(layout(**fields), precision, torch.device("cpu"))  # type: ignore[arg-type]
    assert info.value.field == field and str(info.value).startswith(f"layout.{field}:")


def test_context_parallel_and_offload_are_refused() -> None:
    from dataclasses import replace

    with pytest.raises(UnsupportedLayout, match=r"layout\.cp"):
        check_supported(replace(layout(sharding="fsdp", dp=2), cp=2), "bf16", torch.device("cpu"))
    with pytest.raises(UnsupportedLayout, match=r"layout\.offload"):
        check_supported(replace(layout(sharding="fsdp", dp=2), offload="optimizer"), "bf16", torch.device("cpu"))


def test_local_batches_partition_the_global_batch_deterministically() -> None:
    whole = global_batch(5, 3, 8, 16, 100)
    assert torch.equal(whole, global_batch(5, 3, 8, 16, 100))
    assert not torch.equal(whole, global_batch(5, 4, 8, 16, 100))
    parts = [local_batch(5, 3, 8, 16, 100, 4, r) for r in range(4)]
    assert torch.equal(torch.cat([x for x, _ in parts]), whole[:, :-1])
    assert torch.equal(torch.cat([y for _, y in parts]), whole[:, 1:])


def test_a_plan_for_a_custom_model_runs_by_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan carries the resolved shape and the training settings: no spec beside it, no re-planning."""
    spec = TrainingSpec.model_validate({"name": "t", "model": TINY_MODEL,
                                        "training": {"global_batch": 8, "precision": "fp32", "optimizer": "sgd",
                                                     "steps": 20},
                                        "resources": {"gpu": "cpu", "gpus_per_node": 2, "nodes": 1}})
    stored = plan(spec)
    job = JobEnv(job_id=7, attempt=2, plan=stored, api_url="http://api", token="shc_1_x")
    for name in list(job.environ()):
        monkeypatch.delenv(name, raising=False)
    for name, value in job.environ().items():
        monkeypatch.setenv(name, value)
    shipped = _plan(None)
    assert shipped == stored  # exactly what the API stored, whole
    cfg = resolve_run(shipped, RunOptions())
    assert cfg.shape == resolve_model(spec.model) and cfg.shape.name == "custom"
    assert (cfg.training.global_batch, cfg.training.optimizer, cfg.steps) == (8, "sgd", 20)
    assert cfg.plan.time == stored.time  # predictions are the stored plan's


def test_a_plan_without_its_shape_is_refused_with_the_fix() -> None:
    old = plan(TrainingSpec.model_validate(spec_dict(2))).model_copy(update={"shape": None})
    with pytest.raises(PlanNotRunnable, match="plan the spec again"):
        resolve_run(old, RunOptions())


def test_unreachable_api_is_logged_not_raised() -> None:
    reporter = ApiReporter("http://127.0.0.1:9", "1", "t", timeout_s=1)
    assert reporter.post(MeasurementKind.HEARTBEAT, {"step": 1}) is False
    assert reporter.failures == 1


def test_a_world_that_does_not_match_the_plan_fails_with_a_clear_error(tmp_path: Path) -> None:
    case = make_case(tmp_path, layout(sharding="ddp", dp=2, micro_batch=4))
    cmd = [sys.executable, "-m", "workers.runtime", "--plan", str(case.plan), "--out", str(case.out),
           "--timeout-s", "20"]
    done = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1
    err = report(case)["error"]
    assert err["type"] == "WorldMismatch" and "2 processes, but 1 were launched" in err["message"]


def test_spec_dict_is_a_valid_spec() -> None:
    TrainingSpec.model_validate(spec_dict(2))
