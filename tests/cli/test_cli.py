"""The `shardctl` command line, through its real console script and through Typer's runner."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from service.cli.main import app, parse_layout_pins
from tests.conftest import BASE_SPEC, EXAMPLES, deep_merge

runner = CliRunner()


def write(tmp_path: Path, data: dict) -> Path:  # type: ignore[type-arg]
    path = tmp_path / "spec.yaml"
    path.write_text(json.dumps(data))
    return path


def test_the_installed_console_script_plans_an_example() -> None:
    exe = shutil.which("shardctl", path=str(Path(sys.executable).parent))
    assert exe, "the shardctl console script is not installed next to this interpreter"
    done = subprocess.run([exe, "plan", str(EXAMPLES / "llama2-13b-8xa100.yaml"), "--json"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["fits"] and plan["layout"]["sharding"] != "ddp"


def test_plan_prints_a_readable_table() -> None:
    result = runner.invoke(app, ["plan", str(EXAMPLES / "llama3-8b-8xh100.yaml")])
    assert result.exit_code == 0, result.output
    for needle in ("Layout", "Memory per GPU (GiB)", "Step time", "MFU", "Runners-up", "fits"):
        assert needle in result.output


def test_every_bundled_example_fits() -> None:
    result = runner.invoke(app, ["plan", *map(str, sorted(EXAMPLES.glob("*.yaml"))), "--json"])
    assert result.exit_code == 0, result.output
    plans = json.loads(result.output)
    assert len(plans) == len(list(EXAMPLES.glob("*.yaml"))) and all(p["fits"] for p in plans)


def test_a_plan_that_does_not_fit_exits_2_and_still_prints(tmp_path: Path) -> None:
    path = write(tmp_path, deep_merge(BASE_SPEC, {"model": {"preset": "llama-3.1-405b"}}))
    result = runner.invoke(app, ["plan", str(path), "--json"])
    assert result.exit_code == 2
    plan = json.loads(result.output)
    assert plan["fits"] is False and plan["min_gpus_to_fit"] > 8 and plan["reasons"]


def test_an_invalid_spec_exits_1_naming_the_field(tmp_path: Path) -> None:
    path = write(tmp_path, deep_merge(BASE_SPEC, {"training": {"global_batch": -1}}))
    result = runner.invoke(app, ["plan", str(path)])
    assert result.exit_code == 1
    assert "training.global_batch" in result.output


def test_a_planner_level_problem_exits_1_naming_the_field(tmp_path: Path) -> None:
    path = write(tmp_path, deep_merge(BASE_SPEC, {"resources": {"gpu": "H900"}}))
    result = runner.invoke(app, ["plan", str(path)])
    assert result.exit_code == 1
    assert "resources.gpu" in result.output and "unknown GPU" in result.output


def test_layout_option_pins_on_top_of_the_spec() -> None:
    result = runner.invoke(app, ["plan", str(EXAMPLES / "llama3-8b-8xh100.yaml"), "--layout",
                                 "tp=2,sharding=zero2", "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    assert (plan["layout"]["tp"], plan["layout"]["sharding"]) == (2, "zero2")


def test_bad_layout_option_names_the_pin() -> None:
    result = runner.invoke(app, ["plan", str(EXAMPLES / "llama3-8b-8xh100.yaml"), "--layout", "tp=3"])
    assert result.exit_code == 1 and "layout.tp" in result.output
    result = runner.invoke(app, ["plan", str(EXAMPLES / "llama3-8b-8xh100.yaml"), "--layout", "shard=fsdp"])
    assert result.exit_code == 1 and "layout.shard" in result.output


def test_parse_layout_pins_rejects_garbage() -> None:
    assert parse_layout_pins("dp=8, tp=2") == {"dp": "8", "tp": "2"}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_layout_pins("dp8")


def test_spec_schema_prints_json_schema() -> None:
    result = runner.invoke(app, ["spec-schema"])
    assert result.exit_code == 0
    assert json.loads(result.output)["title"] == "TrainingSpec"
