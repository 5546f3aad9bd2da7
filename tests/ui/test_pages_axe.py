"""Every page of the dashboard, checked with axe-core (WCAG 2.1 A/AA and best practices: no serious or
critical violations), as an admin and as a member, with real data on it: sign-in, Jobs, a Job, Queue,
Teams, Pools, Plan (empty, planned, refused), Admin (and a created token), and the error pages. The
new pages are photographed at 1440x900 and 390x844 (`screenshots`)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.specs import tiny
from tests.ui.conftest import Dashboard, expect, run_axe, screenshots, sign_in
from tests.ui.pages_setup import World, build, ran_for_an_hour, refresh_queue_view


@pytest.fixture(scope="module")
def world(quiet_dashboard: Dashboard) -> World:
    built = build(quiet_dashboard)
    ran_for_an_hour(quiet_dashboard, built.jobs["vision"][0])
    refresh_queue_view(quiet_dashboard)
    return built


def check(page: Any, what: str, shot: str | None = None) -> None:
    assert run_axe(page) == [], what
    if shot:
        screenshots(page, shot)


def test_every_page_as_an_admin_has_no_serious_accessibility_violations(quiet_dashboard: Dashboard, world: World,
                                                                         page: Any) -> None:
    base = quiet_dashboard.url
    page.goto(f"{base}/ui/login")
    check(page, "sign-in")
    sign_in(page, base, world.admin, "/ui/jobs")
    check(page, "jobs")
    page.goto(f"{base}/ui/jobs/{world.jobs['vision'][1]}")
    check(page, "job")
    for path, shot in (("/ui/queue", "queue"), ("/ui/teams", "teams"), ("/ui/pools", "pools"),
                       ("/ui/plan", "plan-empty"), ("/ui/admin", "admin")):
        page.goto(f"{base}{path}")
        check(page, path, shot)
    page.goto(f"{base}/ui/plan")
    page.get_by_label("Spec (YAML or JSON)").fill(yaml.safe_dump(tiny(name="axe-plan")))
    page.get_by_role("button", name="Plan", exact=True).click()
    expect(page.locator("#plan-result")).to_be_visible()
    check(page, "plan result", "plan")
    page.get_by_label("Spec (YAML or JSON)").fill(yaml.safe_dump(tiny(resources={"gpus_per_node": 0})))
    page.get_by_role("button", name="Plan", exact=True).click()
    expect(page.get_by_role("alert")).to_be_visible()
    check(page, "plan refused", "plan-refused")
    page.goto(f"{base}/ui/admin")
    page.get_by_label("Team (members)").fill("audio")
    page.get_by_role("button", name="Create token").click()
    expect(page.locator("#token-created")).to_be_visible()
    check(page, "admin, token created", "admin-token-created")
    page.goto(f"{base}/ui/jobs/999999")
    check(page, "not found page")


def test_every_page_as_a_member_has_no_serious_accessibility_violations(quiet_dashboard: Dashboard,
                                                                         world: World, page: Any) -> None:
    base = quiet_dashboard.url
    sign_in(page, base, world.vision, "/ui/queue")
    check(page, "queue, member", "queue-member")
    for path in ("/ui/jobs", f"/ui/jobs/{world.jobs['vision'][0]}", "/ui/teams", "/ui/pools", "/ui/plan"):
        page.goto(f"{base}{path}")
        check(page, path)
    page.goto(f"{base}/ui/admin")
    expect(page.get_by_role("heading", name="Admins only")).to_be_visible()
    check(page, "403 page", "forbidden")
