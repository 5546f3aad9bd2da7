"""The Plan and Admin pages in a real browser: a pasted spec is planned without a job being made, a bad
spec is refused naming its field, a fitting one is submitted; the Admin page is for admins only
(members get a 403 and no link), a created token's secret is shown once and works, revoking ends it,
a quota edit reaches the API, and a POST without the page's CSRF token is refused."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest
import yaml

from tests.specs import tiny
from tests.ui.conftest import Dashboard, expect, sign_in
from tests.ui.pages_setup import World, build


@pytest.fixture(scope="module")
def world(quiet_dashboard: Dashboard) -> World:
    return build(quiet_dashboard, vision_jobs=1, audio_jobs=1)


def _jobs(dashboard: Dashboard, token: str) -> int:
    with dashboard.api(token) as api:
        return len(api.get("/v1/jobs").json()["items"])


def test_plan_shows_the_plan_breakdown_and_alternatives_without_submitting(quiet_dashboard: Dashboard,
                                                                          world: World, page: Any) -> None:
    before = _jobs(quiet_dashboard, world.vision)
    sign_in(page, quiet_dashboard.url, world.vision, "/ui/plan")
    page.get_by_label("Spec (YAML or JSON)").fill(yaml.safe_dump(tiny(name="planned-only")))
    page.get_by_role("button", name="Plan", exact=True).click()
    result = page.locator("#plan-result")
    expect(result.locator("#plan-h")).to_have_text(re.compile(r"planned-only: fits on 2 × cpu"))
    expect(page.locator("#plan-memory")).to_contain_text("Optimizer")
    expect(page.locator("#plan-time")).to_contain_text("Step")
    expect(page.locator("#plan-explanation li").first).to_be_visible()
    expect(page.locator("#plan-alternatives tbody tr").first).to_be_visible()
    assert _jobs(quiet_dashboard, world.vision) == before  # a plan is not a job

    page.get_by_role("button", name="Submit this job").click()
    page.wait_for_url(re.compile(r".*/ui/jobs/\d+$"))
    job_id = int(page.url.rsplit("/", 1)[1])
    with quiet_dashboard.api(world.vision) as api:
        job = api.get(f"/v1/jobs/{job_id}").json()
    assert job["name"] == "planned-only" and job["team"] == "vision"


def test_plan_refuses_a_bad_spec_naming_the_field(quiet_dashboard: Dashboard, world: World, page: Any) -> None:
    sign_in(page, quiet_dashboard.url, world.vision, "/ui/plan")
    box = page.get_by_label("Spec (YAML or JSON)")
    box.fill(yaml.safe_dump(tiny(resources={"gpus_per_node": 0})))
    page.get_by_role("button", name="Plan", exact=True).click()
    alert = page.get_by_role("alert")
    expect(alert).to_contain_text("resources.gpus_per_node")
    expect(box).to_have_attribute("aria-invalid", "true")
    assert "gpus_per_node: 0" in box.input_value()  # the text stays, to fix
    expect(page.get_by_role("button", name="Submit this job")).to_have_count(0)
    box.fill('{"name": "x", "model": ')
    page.get_by_role("button", name="Plan", exact=True).click()
    expect(page.get_by_role("alert")).to_contain_text("not YAML or JSON at line 1")


def test_admin_is_for_admins_only(quiet_dashboard: Dashboard, world: World, page: Any) -> None:
    sign_in(page, quiet_dashboard.url, world.vision, "/ui/jobs")
    nav = page.get_by_role("navigation", name="Main")
    expect(nav.get_by_role("link", name="Queue")).to_be_visible()
    expect(nav.get_by_role("link", name="Admin")).to_have_count(0)
    answer = page.goto(f"{quiet_dashboard.url}/ui/admin")
    assert answer is not None and answer.status == 403
    expect(page.get_by_role("heading", name="Admins only")).to_be_visible()
    posted = page.request.post(f"{quiet_dashboard.url}/ui/admin/tokens",
                               form={"csrf": _csrf(page), "role": "admin"}, max_redirects=0)
    assert posted.status == 403  # with a valid CSRF token, still not an admin
    with quiet_dashboard.api(world.admin) as api:
        admins = [t for t in api.get("/v1/tokens").json() if t["role"] == "admin"]
    assert len(admins) == 1  # no admin token was made


def _csrf(page: Any) -> str:
    return str(page.evaluate("JSON.parse(document.body.getAttribute('hx-headers'))['X-CSRF-Token']"))


def test_a_created_token_is_shown_once_works_and_revoking_ends_it(quiet_dashboard: Dashboard, world: World,
                                                                  page: Any) -> None:
    sign_in(page, quiet_dashboard.url, world.admin, "/ui/admin")
    page.get_by_label("Team (members)").fill("vision")
    page.get_by_label("Name", exact=True).fill("ci-bot")
    page.get_by_role("button", name="Create token").click()
    secret = page.get_by_label(re.compile("Secret of token")).input_value()
    assert secret.startswith("shc_")
    with httpx.Client(base_url=quiet_dashboard.url, headers={"Authorization": f"Bearer {secret}"}) as api:
        who = api.get("/v1/whoami")
        assert who.status_code == 200 and who.json()["team"] == "vision"
        token_id = who.json()["token_id"]
        page.goto(f"{quiet_dashboard.url}/ui/admin")
        assert secret not in page.content()  # shown once
        row = page.locator(f"#token-{token_id}")
        expect(row).to_contain_text("ci-bot")
        row.get_by_role("button", name=f"Revoke token {token_id}").click()
        expect(page.locator("#admin-notice")).to_contain_text(f"Token {token_id} is revoked")
        expect(page.locator(f"#token-{token_id}")).to_have_count(0)  # revoked ones are hidden by default
        assert api.get("/v1/whoami").status_code == 401
    page.goto(f"{quiet_dashboard.url}/ui/admin?revoked=1")
    expect(page.locator(f"#token-{token_id}")).to_contain_text("revoked")


def test_a_quota_edit_reaches_the_api_and_a_bad_one_names_the_field(quiet_dashboard: Dashboard, world: World,
                                                                     page: Any) -> None:
    sign_in(page, quiet_dashboard.url, world.admin, "/ui/admin")
    form = page.locator("form[action='/ui/admin/quota']")
    form.get_by_label("Team").fill("audio")
    form.get_by_label("Nominal GPUs").fill("many")
    form.get_by_role("button", name="Save quota").click()
    expect(page.get_by_role("alert")).to_contain_text("nominal: 'many' is not a whole number")
    form.get_by_label("Nominal GPUs").fill("2")
    form.get_by_label("May lend").fill("1")
    form.get_by_label("Highest priority").fill("50")
    form.get_by_role("button", name="Save quota").click()
    expect(page.locator("#admin-notice")).to_contain_text("Team audio's quota is saved")
    expect(page.locator("#admin-team-audio")).to_contain_text("cpu: 2, may lend 1")  # empty "may borrow": any
    with quiet_dashboard.api(world.admin) as api:
        quota = api.get("/v1/teams/audio/quota").json()["quota"]
    assert quota["flavors"]["cpu"] == {"nominal": 2, "borrowing_limit": None, "lending_limit": 1}
    assert quota["max_priority"] == 50


def test_admin_posts_without_the_csrf_token_are_refused(quiet_dashboard: Dashboard, world: World,
                                                        page: Any) -> None:
    sign_in(page, quiet_dashboard.url, world.admin, "/ui/admin")
    base = quiet_dashboard.url
    for path, form in (("/ui/admin/quota", {"team": "audio", "gpu": "cpu", "nominal": "9"}),
                       ("/ui/admin/tokens", {"role": "admin"}),
                       ("/ui/plan", {"spec": yaml.safe_dump(tiny())}),
                       ("/ui/plan/submit", {"spec": yaml.safe_dump(tiny())})):
        answer = page.request.post(f"{base}{path}", form=form, max_redirects=0)
        assert answer.status == 403 and "CSRF" in answer.text(), path
    with quiet_dashboard.api(world.admin) as api:
        assert api.get("/v1/teams/audio/quota").json()["quota"]["flavors"]["cpu"]["nominal"] != 9
        assert len([t for t in api.get("/v1/tokens").json() if t["role"] == "admin"]) == 1
