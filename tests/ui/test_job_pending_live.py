"""The Job page's "why pending" stays current while the page is open: when a job ahead is cancelled,
the position and the jobs ahead change without a reload; once the job no longer waits the section
stops refreshing; another team's job is "not found" there as everywhere (no dispatcher: jobs wait)."""

from __future__ import annotations

from typing import Any

from tests.specs import tiny
from tests.ui.conftest import Dashboard, expect, run_axe, sign_in

#: The section refreshes every 10 s; give the browser two refreshes and the page's own slack.
REFRESH_WAIT_MS = 30_000


def test_position_and_jobs_ahead_update_without_reload(quiet_dashboard: Dashboard, page: Any) -> None:
    member = quiet_dashboard.token("member", team="vision")
    with quiet_dashboard.api(member) as api:
        first, second, third = (api.post("/v1/jobs", json=tiny(name=f"wait-{i}")).json()["id"] for i in range(3))
    sign_in(page, quiet_dashboard.url, member, next_path=f"/ui/jobs/{third}")
    pending = page.locator("#job-pending")
    expect(pending).to_contain_text("Position: 3 in team, 3 in pool")
    expect(pending.get_by_role("link", name=f"#{second}")).to_be_visible()
    assert run_axe(page) == []
    page.evaluate("window.__notReloaded = true")

    with quiet_dashboard.api(member) as api:
        assert api.post(f"/v1/jobs/{second}/cancel").status_code == 200
    expect(pending).to_contain_text("Position: 2 in team, 2 in pool", timeout=REFRESH_WAIT_MS)
    expect(pending.get_by_role("link", name=f"#{second}")).to_have_count(0)
    expect(pending.get_by_role("link", name=f"#{first}")).to_be_visible()

    with quiet_dashboard.api(member) as api:
        assert api.post(f"/v1/jobs/{first}/cancel").status_code == 200
    expect(pending).to_contain_text("Position: 1 in team, 1 in pool", timeout=REFRESH_WAIT_MS)
    assert page.evaluate("window.__notReloaded") is True  # the section changed in place


def test_the_fragment_stops_polling_once_the_job_no_longer_waits_and_hides_other_teams(
        quiet_dashboard: Dashboard, page: Any, browser: Any) -> None:
    member = quiet_dashboard.token("member", team="vision")
    with quiet_dashboard.api(member) as api:
        job_id = api.post("/v1/jobs", json=tiny(name="ends")).json()["id"]
    sign_in(page, quiet_dashboard.url, member)
    waiting = page.request.get(f"{quiet_dashboard.url}/ui/jobs/{job_id}/pending")
    assert waiting.status == 200 and "Why it is pending" in waiting.text()
    assert 'hx-trigger="every 10s"' in waiting.text()
    with quiet_dashboard.api(member) as api:
        assert api.post(f"/v1/jobs/{job_id}/cancel").status_code == 200
    ended = page.request.get(f"{quiet_dashboard.url}/ui/jobs/{job_id}/pending")
    assert ended.status == 200 and "Why it is pending" not in ended.text()
    assert "hx-trigger" not in ended.text() and 'id="job-pending"' in ended.text()  # nothing polls it again

    other = browser.new_context()
    stranger = other.new_page()
    sign_in(stranger, quiet_dashboard.url, quiet_dashboard.token("member", team="audio"))
    hidden = stranger.request.get(f"{quiet_dashboard.url}/ui/jobs/{job_id}/pending")
    assert hidden.status == 404 and f"no job {job_id}" in hidden.text()
    other.close()
