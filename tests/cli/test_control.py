"""The CLI as a client of a live API (uvicorn on localhost), on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from service.cli.main import app
from tests.conftest import EXAMPLES
from tests.db_fixtures import Env
from tests.specs import tiny

runner = CliRunner()


@pytest.fixture
def cli(env: Env, live: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Run `shardctl ...` against the live server with a fresh config file and the env's database."""
    monkeypatch.setenv("SHARDCTL_CONFIG", str(tmp_path / "cli.json"))
    monkeypatch.setenv("SHARDCTL_URL", live)
    monkeypatch.setenv("SHARDCTL_DATABASE_URL", env.url)
    monkeypatch.delenv("SHARDCTL_TOKEN", raising=False)

    def run(*args: str, token: str | None = None) -> tuple[int, str]:
        extra = {"SHARDCTL_TOKEN": token} if token else {}
        result = runner.invoke(app, list(args), env=extra)
        return result.exit_code, result.output

    return run


def test_first_admin_token_is_printed_once_and_kept_in_the_config(cli, tmp_path: Path) -> None:
    code, out = cli("token", "create", "--admin", "--json")
    assert code == 0, out
    token = json.loads(out)["token"]
    assert json.loads((tmp_path / "cli.json").read_text())["token"] == token
    assert (tmp_path / "cli.json").stat().st_mode & 0o077 == 0
    code, out = cli("jobs", "--json")  # uses the saved token
    assert code == 0 and json.loads(out)["items"] == []


def test_a_researchers_day(cli, tmp_path: Path) -> None:
    cli("token", "create", "--admin")
    assert cli("team", "create", "alpha")[0] == 0
    code, member = cli("token", "create", "--team", "alpha")
    assert code == 0 and member.strip().startswith("shc_")
    member = member.strip()
    spec = tmp_path / "tiny.yaml"
    spec.write_text(json.dumps(tiny()))
    code, out = cli("submit", str(spec), "--idempotency-key", "run-1", "--json", token=member)
    assert code == 0, out
    job = json.loads(out)
    assert job["team"] == "alpha" and job["status"] == "QUEUED"
    code, again = cli("submit", str(spec), "--idempotency-key", "run-1", "--json", token=member)
    assert json.loads(again)["id"] == job["id"]
    code, out = cli("jobs", token=member)
    assert code == 0 and "tiny" in out and "QUEUED" in out
    code, out = cli("show", str(job["id"]), token=member)
    assert code == 0 and "Memory per GPU" in out
    code, out = cli("cancel", str(job["id"]), token=member)
    assert code == 0 and "CANCELLED" in out
    code, out = cli("events", str(job["id"]), "--follow", token=member)
    assert code == 0 and "job.queued" in out and "job.cancelled" in out
    code, out = cli("events", str(job["id"]), "--json", token=member)
    assert [json.loads(line)["kind"] for line in out.splitlines()] == ["job.queued", "job.cancelled"]


def test_tokens_can_be_listed_and_revoked(cli) -> None:
    cli("token", "create", "--admin")
    cli("team", "create", "alpha")
    member = cli("token", "create", "--team", "alpha", "--json")[1]
    token_id = json.loads(member)["id"]
    code, out = cli("token", "list", "--json")
    assert code == 0 and token_id in {t["id"] for t in json.loads(out)}
    assert cli("token", "revoke", token_id)[0] == 0
    code, out = cli("jobs", token=json.loads(member)["token"])
    assert code == 1 and "revoked" in out


def test_errors_are_one_readable_message(cli, tmp_path: Path) -> None:
    code, out = cli("jobs", token="shc_nope_nope")
    assert code == 1 and "unauthorized" in out and "token create --admin" in out
    cli("token", "create", "--admin")
    big = tmp_path / "big.yaml"
    big.write_text(json.dumps(tiny(model={"preset": "llama-3.1-405b"},
                                   resources={"gpu": "H100-SXM-80GB", "gpus_per_node": 8})))
    code, out = cli("submit", str(big))
    assert code == 2 and "no layout fits" in out  # 2: does not fit, as `shardctl plan` exits
    assert "smallest GPU count that fits" in out
    code, out = cli("show", "424242")
    assert code == 1 and "no job 424242" in out


def test_a_spec_the_api_refuses_prints_as_plan_prints_it(cli, tmp_path: Path) -> None:
    """The spec passes its own validation, the planner refuses it on the server: a 422 whose fields
    print one `field: message` line each under the file's name, with no pydantic links."""
    cli("token", "create", "--admin")
    spec = tmp_path / "odd-gpu.yaml"
    spec.write_text(json.dumps(tiny(resources={"gpu": "H900", "gpus_per_node": 8})))
    for args in (("submit", str(spec)), ("submit", str(spec), "--dry-run")):
        code, out = cli(*args)
        assert code == 1, out
        lines = out.splitlines()
        assert lines[0] == f"{spec}: invalid spec", out
        assert any(line.startswith("  resources.gpu: ") and "unknown GPU" in line for line in lines), out
        assert "errors.pydantic.dev" not in out and "HTTP 422" not in out


def test_show_brief_puts_the_plan_on_one_line(cli, tmp_path: Path) -> None:
    cli("token", "create", "--admin")
    spec = tmp_path / "tiny.yaml"
    spec.write_text(json.dumps(tiny()))
    job = json.loads(cli("submit", str(spec), "--json")[1])
    code, out = cli("show", str(job["id"]), "--brief")
    assert code == 0, out
    assert "Memory per GPU" not in out
    assert any(line.startswith("  plan tiny: ") and "/step" in line for line in out.splitlines()), out
    assert "no measurements reported yet" in out


def test_an_unreachable_api_says_how_to_start_it(cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDCTL_URL", "http://127.0.0.1:9")
    code, out = cli("jobs", token="shc_a_b")
    assert code == 1 and "shardctl serve" in out


def test_db_upgrade_reports_the_revision(cli) -> None:
    from alembic.script import ScriptDirectory

    from service.store.migrate import alembic_config

    head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    code, out = cli("db", "upgrade")
    assert code == 0 and f"revision {head}" in out and head is not None


def test_submit_example_through_the_api(cli) -> None:
    cli("token", "create", "--admin")
    code, out = cli("submit", str(EXAMPLES / "tiny-cpu.yaml"))
    assert code == 0 and "QUEUED" in out


def test_serve_on_an_empty_database_saves_a_first_admin_token_and_prints_only_where(env: Env,
                                                                                    tmp_path: Path) -> None:
    """The first admin token goes to the CLI config (0600), whose path is printed; never the token
    itself on stderr, which ends up in journals and log collectors."""
    import os
    import socket
    import subprocess
    import sys
    import time

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = tmp_path / "cli.json"
    environ = {**os.environ, "SHARDCTL_DATABASE_URL": env.url, "SHARDCTL_CONFIG": str(config),
               "SHARDCTL_DATA_DIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "service.cli.main", "serve", "--port", str(port)],
                            env=environ, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(line.startswith("shardctl API on") for line in lines):
            line = proc.stderr.readline()  # type: ignore[union-attr]
            if not line:
                break
            lines.append(line)
        token = json.loads(config.read_text())["token"]
        assert token.startswith("shc_") and config.stat().st_mode & 0o777 == 0o600
        assert str(config) in "".join(lines).replace("\n", "") and token not in "".join(lines)
        for _ in range(100):
            try:
                who = httpx.get(f"http://127.0.0.1:{port}/v1/whoami", headers={"Authorization": f"Bearer {token}"})
                break
            except httpx.TransportError:
                time.sleep(0.1)
        assert who.json()["role"] == "admin"
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_show_sets_the_profile_verdict_against_the_plan(cli, env: Env, tmp_path: Path) -> None:
    from service.profiles import analyze_traces

    gloo = sorted((Path(__file__).parents[1] / "profiles" / "fixtures" / "gloo_ddp").glob("rank-*.json.gz"))
    cli("token", "create", "--admin")
    cli("team", "create", "alpha")
    member = cli("token", "create", "--team", "alpha")[1].strip()
    spec = tmp_path / "tiny.yaml"
    spec.write_text(json.dumps(tiny()))
    job = json.loads(cli("submit", str(spec), "--json", token=member)[1])
    summary = analyze_traces(gloo, predicted_comm_fraction=0.1).model_dump(mode="json")
    job_token = env.headers(env.token("job", job_id=job["id"]))
    assert env.client.post(f"/v1/jobs/{job['id']}/profiles", json=summary, headers=job_token).status_code == 201
    code, out = cli("show", str(job["id"]), token=member)
    assert code == 0, out
    assert "Profile verdict: input" in out and "INPUT:" in out
    assert "the plan's predicted 10.0%" in out
