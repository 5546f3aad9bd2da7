"""The systemd units in deploy/ run commands the CLI has, and give serve and worker their shutdown grace
before systemd sends SIGKILL."""

from __future__ import annotations

import configparser
import shlex
from pathlib import Path

import pytest

from service.cli.connections import DEFAULT_MAX_CONNECTIONS, FD_RESERVE
from service.settings import Settings
from tests.server.procs import ROOT, environ, run_shardctl

UNITS = sorted((ROOT / "deploy").glob("shardctl-*.service"))


def _service(unit: Path) -> configparser.SectionProxy:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(unit.read_text())
    return parser["Service"]


@pytest.mark.parametrize("unit", UNITS, ids=[u.name for u in UNITS])
def test_a_unit_runs_a_command_the_cli_has_and_waits_out_the_grace(unit: Path, tmp_path: Path) -> None:
    service = _service(unit)
    argv = shlex.split(service["ExecStart"])
    assert argv[0].endswith("/bin/shardctl") and argv[1] in ("serve", "worker")
    done = run_shardctl([*argv[1:], "--help"], environ(tmp_path, f"sqlite:///{tmp_path / 'db.sqlite'}"))
    assert done.returncode == 0, done.stderr  # every option the unit passes exists
    assert service["KillSignal"] == "SIGTERM"
    assert float(service["TimeoutStopSec"]) > Settings().shutdown_grace_s + 5


def test_both_units_are_there() -> None:
    assert [u.name for u in UNITS] == ["shardctl-api.service", "shardctl-dispatcher.service"]


def test_the_api_unit_leaves_room_for_the_default_connection_cap() -> None:
    service = _service(ROOT / "deploy" / "shardctl-api.service")
    assert int(service["LimitNOFILE"]) >= DEFAULT_MAX_CONNECTIONS + FD_RESERVE
