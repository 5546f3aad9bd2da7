"""``profile analyze`` through Typer's CliRunner."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from service.cli.profile import profile_app

GLOO = sorted((Path(__file__).parent / "fixtures" / "gloo_ddp").glob("rank-*.json.gz"))
GPU = sorted((Path(__file__).parent / "fixtures" / "synthetic_gpu").glob("rank-*.json.gz"))
runner = CliRunner()


def test_json_has_per_rank_hta_compat() -> None:
    res = runner.invoke(profile_app, ["analyze", *map(str, GPU), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert set(doc["ranks"]) == {"0", "1"}
    expected = json.loads((GPU[0].parent / "expected_hta.json").read_text())["ranks"]
    for rank, block in doc["ranks"].items():
        hta = block["hta_compat"]
        for key in ("idle_time_pctg", "compute_time_pctg", "non_compute_time_pctg", "comm_comp_overlap_pctg"):
            assert hta[key] == expected[rank][key]
    assert doc["diagnosis"]["bound"] in {
        "compute",
        "communication",
        "memory",
        "input",
        "host_launch",
        "idle",
        "balanced",
    }


def test_table_output_names_verdict_and_straggler() -> None:
    res = runner.invoke(profile_app, ["analyze", *map(str, GLOO)])
    assert res.exit_code == 0, res.output
    assert "Verdict:" in res.stdout and "Straggler: rank 1" in res.stdout


def test_bad_input_exits_1_with_message(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    res = runner.invoke(profile_app, ["analyze", str(bad)])
    assert res.exit_code == 1
    assert "bad.json" in res.output and "not a JSON trace" in res.output


def test_max_events_flag_refuses_a_larger_trace_and_says_how_to_fix_it() -> None:
    res = runner.invoke(profile_app, ["analyze", *map(str, GPU), "--max-events", "50"])
    assert res.exit_code == 1
    assert "more than 50 complete events" in res.output and "--max-events" in res.output
    assert runner.invoke(profile_app, ["analyze", *map(str, GPU), "--max-events", "0"]).exit_code == 2
