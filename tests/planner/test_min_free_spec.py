"""`planner.min_free_fraction` in the spec: validated, used by `plan`, the CLI and the API's plan cache."""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest
import yaml
from typer.testing import CliRunner

from service.api.submission import PLANNED
from service.cli.main import app
from service.planner import plan
from service.spec import field_path
from tests.conftest import make_spec


def test_the_spec_field_decides_headroom_as_the_keyword_does() -> None:
    # Llama-3.1-8B on 8 H100s: its fastest layouts use 80% of the memory or more.
    bold = plan(make_spec(planner={"min_free_fraction": 0.0}))
    careful = plan(make_spec(planner={"min_free_fraction": 0.3}))
    assert careful.layout == plan(make_spec(), min_free_fraction=0.3).layout
    limit = careful.memory.gpu_memory
    assert careful.memory.total <= 0.7 * limit < bold.memory.total
    assert careful.time.step_s > bold.time.step_s
    assert any(line.startswith("Headroom decided") and "30% minimum free" in line for line in careful.explanation)
    # An explicit keyword overrides the spec (the CLI's --min-free).
    assert plan(make_spec(planner={"min_free_fraction": 0.3}), min_free_fraction=0.0).layout == bold.layout


@pytest.mark.parametrize("value", [0.5, 0.9, -0.1, float("nan")])
def test_a_fraction_out_of_range_names_the_field_and_the_allowed_range(value: float) -> None:
    with pytest.raises(pydantic.ValidationError) as err:
        make_spec(planner={"min_free_fraction": value})
    [error] = err.value.errors()
    assert field_path(error["loc"]) == "planner.min_free_fraction"
    assert "allowed: 0 to 0.5 (0.5 excluded), e.g. 0.1 to keep 10% of GPU memory free" in error["msg"]


def test_the_command_line_reads_the_spec_field_and_its_flag_overrides_it(tmp_path: Path) -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "llama3-70b-64xh100.yaml"
    raw = yaml.safe_load(example.read_text())
    raw["planner"] = {"min_free_fraction": 0.0}
    bold_spec = tmp_path / "bold.yaml"
    bold_spec.write_text(yaml.safe_dump(raw))

    def used_gib(*args: str) -> float:
        result = CliRunner().invoke(app, ["plan", "--brief", *args], env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output
        return float(result.output.split(" GiB")[0].split(", ")[-1].split(" / ")[0])

    assert used_gib(str(example)) <= 0.9 * 80 < used_gib(str(bold_spec))
    assert used_gib("--min-free", "0.1", str(bold_spec)) == used_gib(str(example))
    refused = CliRunner().invoke(app, ["plan", "--min-free", "0.7", str(example)], env={"COLUMNS": "200"})
    assert refused.exit_code == 1
    assert "planner.min_free_fraction" in refused.output and "0 to 0.5" in refused.output


def test_the_api_plan_cache_tells_specs_with_different_fractions_apart() -> None:
    default, bold = make_spec(), make_spec(planner={"min_free_fraction": 0.0})
    assert default.model_dump_json(include=PLANNED) != bold.model_dump_json(include=PLANNED)
