"""`shardctl webhooks ...` and `shardctl events` against a live API, on both databases."""

from __future__ import annotations

import json

from tests.db_fixtures import Env
from tests.specs import tiny


def test_webhooks_from_the_command_line(admin_cli, env: Env) -> None:
    env.app.state.settings.webhook_allow_private = True
    code, out = admin_cli("webhooks", "add", "http://127.0.0.1:9/hook", "-e", "job.failed", "-e", "job.succeeded",
                    "--json")
    assert code == 0, out
    hook = json.loads(out)
    assert hook["events"] == ["job.failed", "job.succeeded"] and hook["secret"].startswith("whsec_")
    code, out = admin_cli("webhooks", "list", "--json")
    assert code == 0 and [h["id"] for h in json.loads(out)] == [hook["id"]]
    code, out = admin_cli("webhooks", "rotate", hook["id"])
    assert code == 0 and "secret whsec_" in out and hook["secret"] not in out
    code, out = admin_cli("webhooks", "deliveries", hook["id"], "--json")
    assert code == 0 and json.loads(out) == []
    code, out = admin_cli("webhooks", "rm", hook["id"])
    assert code == 0
    code, out = admin_cli("webhooks", "list", "--json")
    assert json.loads(out) == []


def test_a_refused_webhook_says_which_field_and_why(admin_cli) -> None:
    code, out = admin_cli("webhooks", "add", "ftp://93.184.216.34/x")
    assert code == 1 and "url" in out and "http:// or https://" in out
    code, out = admin_cli("webhooks", "add", "https://93.184.216.34/x", "-e", "job.nope")
    assert code == 1 and "job.nope" in out and "job.failed" in out


def test_events_of_every_job_filtered(admin_cli, env: Env) -> None:
    admin = env.headers(env.token("admin"))
    ids = [env.client.post("/v1/jobs", json=tiny(name=f"j{i}"), headers=admin).json()["id"] for i in range(2)]
    assert env.client.post(f"/v1/jobs/{ids[0]}/cancel", headers=admin).status_code == 200
    code, out = admin_cli("events", "--json")
    assert code == 0, out
    assert [(e["job_id"], e["kind"]) for e in map(json.loads, out.splitlines())] == [
        (ids[0], "job.queued"), (ids[1], "job.queued"), (ids[0], "job.cancelled")]
    code, out = admin_cli("events", "--type", "job.cancelled", "--json")
    assert [json.loads(line)["job_id"] for line in out.splitlines()] == [ids[0]]
