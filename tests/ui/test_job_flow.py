"""End to end in a real browser, with a real dispatcher running tiny CPU jobs on the local backend:
a job submitted through the API appears on the Jobs page and goes to SUCCEEDED without a reload;
its page shows the plan, the predicted-vs-measured table, the chart and every rank's logs; a
running job is cancelled from its page; another team gets "not found"; admin actions refuse members."""

from __future__ import annotations

import re
from typing import Any

from service.api.ui.routers.job import VERDICTS
from tests.specs import tiny
from tests.ui.conftest import Dashboard, expect, run_axe, screenshots, sign_in

LONG = 120_000  # ms: a tiny job on a shared 2-core machine starts torch in each of its processes


def quick(name: str) -> dict[str, Any]:
    """The tiny spec on one CPU process through the built-in runtime: 8 steps, a heartbeat every 2, no
    profiler (each would add seconds of start-up or tracing on a shared machine)."""
    return tiny(name=name, training={"steps": 8}, resources={"gpus_per_node": 1},
                entrypoint={"command": ["python", "-m", "workers.runtime", "--heartbeat-every", "2", "--no-profile",
                                        "--no-track-memory"]})


def sleeper(seconds: int = 300) -> dict[str, Any]:
    """A two-process local job (no torch) that prints from each rank and runs until cancelled."""
    return tiny(name="sleeper", entrypoint={"command": [
        "python", "-c", f"import os, time; print('sleeping on rank', os.environ['RANK'], flush=True);"
        f" time.sleep({seconds})"]})


def test_a_submitted_job_goes_live_to_succeeded_and_its_page_shows_plan_results_chart_and_logs(
        dashboard: Dashboard, page: Any) -> None:
    token = dashboard.token("member", team="vision")
    sign_in(page, dashboard.url, token)
    page.evaluate("window.__notReloaded = true")
    with dashboard.api(token) as api:
        answer = api.post("/v1/jobs", json=quick("tiny-e2e"))
        assert answer.status_code == 201, answer.text
        job_id = answer.json()["id"]
    row = page.locator(f"#job-row-{job_id}")
    expect(row).to_be_visible()  # appeared live, at the top
    expect(row.locator(".status")).to_have_text("SUCCEEDED", timeout=LONG)
    assert page.evaluate("window.__notReloaded") is True  # no reload: the row was updated in place
    expect(page.locator("#job-counts")).to_contain_text("succeeded")
    assert run_axe(page) == []
    screenshots(page, "jobs")

    row.get_by_role("link", name=f"#{job_id}").click()
    page.wait_for_url(f"**/ui/jobs/{job_id}")
    expect(page.get_by_role("heading", name=f"Job #{job_id}: tiny-e2e")).to_be_visible()
    plan = page.locator("#job-plan")
    expect(plan.get_by_role("img", name=re.compile("Per-GPU memory"))).to_be_visible()
    expect(plan).to_contain_text("Why this layout")
    measured = page.locator("#measured-table")
    expect(measured.get_by_role("row", name=re.compile("Step time"))).to_contain_text("×")
    expect(page.locator("#job-chart svg.line-chart").first).to_be_visible()
    expect(page.locator("#job-logs")).to_contain_text(re.compile(r"\[rank 0\] INFO"), timeout=30_000)
    expect(page.locator("#job-events")).to_contain_text("job.succeeded")
    timeline = page.get_by_role("list", name="Timeline")
    expect(timeline).to_contain_text("waiting")  # the time between queued and started is shown
    assert run_axe(page) == []
    screenshots(page, "job")


def test_a_running_job_is_cancelled_from_its_page_and_other_teams_find_nothing(dashboard: Dashboard,
                                                                               page: Any, browser: Any) -> None:
    token = dashboard.token("member", team="vision")
    with dashboard.api(token) as api:
        job_id = api.post("/v1/jobs", json=sleeper()).json()["id"]
    sign_in(page, dashboard.url, token, next_path=f"/ui/jobs/{job_id}")
    expect(page.locator("#job-status")).to_have_text("RUNNING", timeout=LONG)  # live, without a reload
    logs = page.locator("#job-logs")  # every rank's lines, merged, each with its rank
    expect(logs).to_contain_text("[rank 0] sleeping on rank 0", timeout=30_000)
    expect(logs).to_contain_text("[rank 1] sleeping on rank 1")
    page.get_by_role("button", name="Cancel job").click()
    expect(page.locator("#job-status")).to_have_text("CANCELLED", timeout=60_000)
    expect(page.locator("#job-events")).to_contain_text("job.cancelling")

    other = browser.new_context(viewport={"width": 1440, "height": 900})
    stranger = other.new_page()
    sign_in(stranger, dashboard.url, dashboard.token("member", team="audio"))
    answer = stranger.goto(f"{dashboard.url}/ui/jobs/{job_id}")
    assert answer is not None and answer.status == 404
    expect(stranger.get_by_role("heading", name=re.compile("Not found"))).to_be_visible()
    assert f"no job {job_id}" in stranger.content()
    assert run_axe(stranger) == []
    screenshots(stranger, "not-found")
    # the Jobs page of the other team does not list it either
    stranger.goto(f"{dashboard.url}/ui/jobs")
    expect(stranger.locator(f"#job-row-{job_id}")).to_have_count(0)
    other.close()


def test_admins_change_priority_and_members_are_refused(quiet_dashboard: Dashboard, page: Any,
                                                        browser: Any) -> None:
    member = quiet_dashboard.token("member", team="vision")
    with quiet_dashboard.api(member) as api:
        job_id = api.post("/v1/jobs", json=tiny(name="waits")).json()["id"]
    sign_in(page, quiet_dashboard.url, member, next_path=f"/ui/jobs/{job_id}")
    expect(page.get_by_role("button", name="Set priority")).to_have_count(0)  # hidden from members
    expect(page.get_by_role("heading", name="Why it is pending")).to_be_visible()
    csrf = page.locator("input[name=csrf]").first.get_attribute("value")
    refused = page.request.post(f"{quiet_dashboard.url}/ui/jobs/{job_id}/priority",
                                form={"csrf": csrf, "priority": "500"}, max_redirects=0)
    assert refused.status == 403 and "Admins only" in refused.text()
    assert run_axe(page) == []
    screenshots(page, "job-queued")

    admin_context = browser.new_context(viewport={"width": 1440, "height": 900})
    admin = admin_context.new_page()
    sign_in(admin, quiet_dashboard.url, quiet_dashboard.token("admin"), next_path=f"/ui/jobs/{job_id}")
    admin.get_by_label("Priority (-1000 to 1000)").fill("500")
    admin.get_by_role("button", name="Set priority").click()
    expect(admin.locator("#job-events")).to_contain_text("priority changed from 0 to 500")
    with quiet_dashboard.api(member) as api:
        assert api.get(f"/v1/jobs/{job_id}").json()["priority"] == 500
    admin_csrf = admin.locator("input[name=csrf]").first.get_attribute("value")
    out_of_range = admin.request.post(f"{quiet_dashboard.url}/ui/jobs/{job_id}/priority",
                                      form={"csrf": admin_csrf, "priority": "5000"}, max_redirects=0)
    assert out_of_range.status == 422  # the browser's own range check aside, the server names the field
    assert "priority: &#39;5000&#39; is not a whole number from -1000 to 1000" in out_of_range.text()
    admin_context.close()

    # the member resubmits: a new job from the same spec
    page.goto(f"{quiet_dashboard.url}/ui/jobs/{job_id}")
    page.get_by_role("button", name="Resubmit as a new job").click()
    page.wait_for_url(re.compile(r".*/ui/jobs/\d+$"))
    new_id = int(page.url.rsplit("/", 1)[1])
    assert new_id != job_id
    expect(page.get_by_role("heading", name=f"Job #{new_id}: waits")).to_be_visible()
    # cancelling needs the page's CSRF token too
    forged = page.request.post(f"{quiet_dashboard.url}/ui/jobs/{new_id}/cancel", form={}, max_redirects=0)
    assert forged.status == 403
    with quiet_dashboard.api(member) as api:
        assert api.get(f"/v1/jobs/{new_id}").json()["status"] == "QUEUED"


def test_the_profile_verdict_evidence_and_advice_are_shown(quiet_dashboard: Dashboard, page: Any) -> None:
    from service.profiles import analyze_traces
    from tests.support.traces import GLOO

    member = quiet_dashboard.token("member", team="vision")
    with quiet_dashboard.api(member) as api:
        job_id = api.post("/v1/jobs", json=tiny(name="profiled")).json()["id"]
    summary = analyze_traces(GLOO)
    with quiet_dashboard.api(quiet_dashboard.token("admin")) as api:
        answer = api.post(f"/v1/jobs/{job_id}/profiles", json=summary.model_dump(mode="json"))
        assert answer.status_code == 201, answer.text
    sign_in(page, quiet_dashboard.url, member, next_path=f"/ui/jobs/{job_id}")
    results = page.locator("#job-results")
    expect(results).to_contain_text(f"Verdict: {VERDICTS[summary.diagnosis.bound]}")
    expect(results).to_contain_text(summary.diagnosis.evidence[0])
    if summary.diagnosis.recommendations:
        expect(results).to_contain_text(summary.diagnosis.recommendations[0].text)
