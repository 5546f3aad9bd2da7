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


# -- exit codes and clean errors -------------------------------------------------------------------

PYDANTIC_LINK = "errors.pydantic.dev"


def test_a_missing_spec_file_exits_3_naming_it_once(tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    result = runner.invoke(app, ["plan", str(missing)])
    assert result.exit_code == 3, result.output
    assert result.output.count(str(missing)) == 1 and "no such file" in result.output


def test_a_directory_is_not_a_spec_and_exits_3(tmp_path: Path) -> None:
    result = runner.invoke(app, ["plan", str(tmp_path)])
    assert result.exit_code == 3 and "is a directory" in result.output


def test_not_utf8_exits_3(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"name: caf\xe9\n")
    result = runner.invoke(app, ["plan", str(path)])
    assert result.exit_code == 3 and "not UTF-8" in result.output


def test_does_not_fit_is_2_and_distinct_from_a_missing_file(tmp_path: Path) -> None:
    big = write(tmp_path, deep_merge(BASE_SPEC, {"model": {"preset": "llama-3.1-405b"}}))
    assert runner.invoke(app, ["plan", str(big)]).exit_code == 2
    assert runner.invoke(app, ["plan", str(tmp_path / "nope.yaml")]).exit_code == 3
    # A fitting spec before a missing one: the missing file decides.
    assert runner.invoke(app, ["plan", str(EXAMPLES / "tiny-cpu.yaml"), str(tmp_path / "nope.yaml")]).exit_code == 3


def test_a_yaml_syntax_error_names_the_file_once(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("name: x\nmodel: [a\n")
    result = runner.invoke(app, ["plan", str(path)])
    assert result.exit_code == 1
    assert result.output.count(str(path)) == 1, result.output
    assert "not valid YAML or JSON" in result.output and "line 2, column 8" in result.output
    assert "<unicode string>" not in result.output
    assert "model: [a" in result.output  # YAML's own excerpt, not eaten as console markup


def test_a_bad_command_line_exits_1_not_2() -> None:
    result = runner.invoke(app, ["plan", "--no-such-option", str(EXAMPLES / "tiny-cpu.yaml")])
    assert result.exit_code == 1


def test_plan_help_documents_the_exit_codes() -> None:
    result = runner.invoke(app, ["plan", "--help"])
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    for needle in ("0 every plan fits", "1 an invalid spec", "2 a plan does not fit", "3 a spec file does not exist"):
        assert needle in text, text


def test_plan_brief_is_one_line_per_spec() -> None:
    specs = sorted(EXAMPLES.glob("*.yaml"))
    result = runner.invoke(app, ["plan", "--brief", *map(str, specs)], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert len(lines) == len(specs)
    tiny = next(line for line in lines if line.startswith("tiny-cpu-demo: "))
    assert "dp=2" in tiny and "/step" in tiny and tiny.endswith("fits")


def test_submit_prints_an_invalid_spec_as_plan_does(tmp_path: Path) -> None:
    """Checked before any request: one `field: message` line per problem, no pydantic links, exit 1."""
    path = write(tmp_path, deep_merge(BASE_SPEC, {"training": {"global_batch": -1, "precision": "fp7"},
                                                  "resources": {"nodes": 0}}))
    outputs = []
    for command in ("plan", "submit"):
        result = runner.invoke(app, [command, str(path)], env={"SHARDCTL_URL": "http://127.0.0.1:9"})
        assert result.exit_code == 1, result.output
        assert PYDANTIC_LINK not in result.output and "Value error" not in result.output
        assert "validation error" not in result.output  # pydantic's own header
        outputs.append(result.output)
    assert outputs[0] == outputs[1]
    lines = outputs[1].splitlines()
    assert lines[0] == f"{path}: invalid spec"
    assert any(line.startswith("  training.global_batch: ") for line in lines)
    assert any(line.startswith("  training.precision: ") for line in lines)
    assert any(line.startswith("  resources.nodes: ") for line in lines)


def test_submit_of_a_missing_file_exits_3(tmp_path: Path) -> None:
    result = runner.invoke(app, ["submit", str(tmp_path / "nope.yaml")], env={"SHARDCTL_URL": "http://127.0.0.1:9"})
    assert result.exit_code == 3 and "no such file" in result.output


def test_offline_plan_says_it_is_not_calibrated_and_refuses_what_the_built_in_trainer_cannot_run(
        tmp_path: Path) -> None:
    """`plan` offline answers what the spec alone tells as a submission would: a 70B job on 8 H100s fits
    only by offloading its parameters, which shardctl's trainer does not do yet; the user's own
    program may."""
    spec = deep_merge(BASE_SPEC, {"model": {"preset": "llama-3.1-70b"}, "layout": {"offload": "params",
                                                                                  "sharding": "fsdp"}})
    result = runner.invoke(app, ["plan", str(write(tmp_path, spec))])
    assert result.exit_code == 1, result.output
    assert "needs_runtime_support" in result.output and "entrypoint.command" in result.output
    assert "Not calibrated: planned offline" in result.output
    own = deep_merge(spec, {"entrypoint": {"command": ["python", "train.py"]}})
    result = runner.invoke(app, ["plan", str(write(tmp_path, own))])
    assert result.exit_code == 0, result.output
