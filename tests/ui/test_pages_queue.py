"""The Queue, Teams and Pools pages in a real browser, on real data: a pool, two teams whose quotas make
jobs wait, queued jobs, and the dispatcher's queue view. A member sees their own team's jobs named and
other teams' only counted; an admin sees all; the queue pages in admission order."""

from __future__ import annotations

import re
from typing import Any

import pytest

from service.api.ui.routers import queue
from tests.ui.conftest import Dashboard, expect, sign_in
from tests.ui.pages_setup import POOL, World, build, ran_for_an_hour, refresh_queue_view


@pytest.fixture(scope="module")
def world(quiet_dashboard: Dashboard) -> World:
    return build(quiet_dashboard)


def test_the_queue_says_when_there_is_no_view_then_shows_it_with_its_age(quiet_dashboard: Dashboard, world: World,
                                                                        page: Any) -> None:
    sign_in(page, quiet_dashboard.url, world.admin, "/ui/queue")
    expect(page.locator("#queue-none")).to_contain_text("No queue view yet")
    refresh_queue_view(quiet_dashboard)
    page.reload()
    expect(page.locator("#queue-as-of")).to_contain_text(re.compile(r"As of .* ago: the dispatcher's queue view of 5"))
    order = [int(text.strip("#")) for text in page.locator("#queue-table tbody tr td:nth-child(2) a").all_inner_texts()]
    assert sorted(order) == sorted(world.jobs["vision"] + world.jobs["audio"])  # the admin sees every team's
    # the second of each team waits on its quota, saying so with the numbers
    waiting = page.locator(f"#queue-row-{world.jobs['vision'][1]}")
    expect(waiting).to_contain_text("quota_exceeded")
    expect(waiting).to_contain_text("team vision")
    expect(page.locator(f"#queue-row-{world.jobs['audio'][1]}")).to_contain_text("quota_exceeded")


def test_a_member_sees_their_team_named_and_other_teams_only_counted(quiet_dashboard: Dashboard, world: World,
                                                                     page: Any) -> None:
    refresh_queue_view(quiet_dashboard)
    sign_in(page, quiet_dashboard.url, world.vision, "/ui/queue")
    rows = page.locator("#queue-table tbody tr")
    expect(rows).to_have_count(len(world.jobs["vision"]))
    for job_id in world.jobs["vision"]:
        expect(page.locator(f"#queue-row-{job_id}")).to_contain_text("vision-run-")
    expect(page.locator("#queue-others")).to_have_text(re.compile(r"cpu: 2 jobs waiting for 2 GPUs"))
    html = page.content()
    assert "audio" not in html  # never named: not the team, not its jobs' names
    for job_id in world.jobs["audio"]:
        assert f"#{job_id}<" not in html and f"queue-row-{job_id}" not in html
    # a member's team filter is ignored: still only their own rows
    page.goto(f"{quiet_dashboard.url}/ui/queue?team=audio")
    expect(rows).to_have_count(len(world.jobs["vision"]))
    assert "audio-run" not in page.content()


def test_the_queue_filters_by_team_pool_and_kind_and_pages_in_admission_order(
        quiet_dashboard: Dashboard, world: World, page: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    refresh_queue_view(quiet_dashboard)
    sign_in(page, quiet_dashboard.url, world.admin, "/ui/queue?team=audio")
    expect(page.locator("#queue-table tbody tr")).to_have_count(len(world.jobs["audio"]))
    page.goto(f"{quiet_dashboard.url}/ui/queue?pool={POOL}&gpu=cpu")
    expect(page.locator("#queue-table tbody tr")).to_have_count(5)
    page.goto(f"{quiet_dashboard.url}/ui/queue?gpu=H100-SXM-80GB")
    expect(page.locator("#queue-empty")).to_be_visible()
    page.goto(f"{quiet_dashboard.url}/ui/queue?pool=Not_A_Pool")
    expect(page.get_by_role("alert")).to_contain_text("pool:")  # the bad filter is named, and ignored

    monkeypatch.setattr(queue, "PAGE_SIZE", 2)  # the server runs in this process
    page.goto(f"{quiet_dashboard.url}/ui/queue")
    seen: list[int] = []
    for _ in range(4):
        seen += [int(t) for t in page.locator("#queue-table tbody td.num:first-child").all_inner_texts()]
        nxt = page.get_by_role("link", name="Next page")
        if nxt.count() == 0:
            break
        nxt.click()
        page.wait_for_load_state()
    assert seen == [1, 2, 3, 4, 5]  # every row once, in admission order, over three pages


def test_teams_page_shows_quota_use_waiting_demand_and_gpu_hours(quiet_dashboard: Dashboard, world: World,
                                                                 page: Any) -> None:
    ran_for_an_hour(quiet_dashboard, world.jobs["vision"][0])
    sign_in(page, quiet_dashboard.url, world.vision, "/ui/teams")
    card = page.locator("#team-vision")
    expect(card).to_be_visible()
    expect(page.locator("#team-audio")).to_have_count(0)  # a member sees their own team
    row = card.get_by_role("row", name=re.compile(r"^cpu"))
    expect(row).to_contain_text("may borrow 0")
    expect(row).to_contain_text("3 jobs, 3 GPUs")  # waiting demand
    expect(row.locator("td").last).to_have_text("1")  # GPU hours over the last days
    title = card.locator("svg title").text_content() or ""
    assert title.startswith("GPU hours per day of team vision") and title.count(";") == 6
    assert sum(float(part.rsplit(" ", 1)[1]) for part in title.split(": ", 1)[1].split("; ")) == pytest.approx(1.0)

    page.context.clear_cookies()
    sign_in(page, quiet_dashboard.url, world.admin, "/ui/teams")
    expect(page.locator("#team-vision")).to_be_visible()
    expect(page.locator("#team-audio")).to_be_visible()
    page.goto(f"{quiet_dashboard.url}/ui/teams?name=aud")
    expect(page.locator("section.team")).to_have_count(1)


def test_pools_page_shows_capacity_and_use_per_pool_and_kind(quiet_dashboard: Dashboard, world: World,
                                                             page: Any) -> None:
    sign_in(page, quiet_dashboard.url, world.audio, "/ui/pools")
    row = page.locator(f"#pool-{POOL}")
    expect(row).to_contain_text("0 of 2 in use, 2 free")
    expect(row).to_contain_text("5 jobs, 5 GPUs")
    expect(page.locator("#kind-totals").get_by_role("row", name=re.compile("^cpu"))).to_contain_text("2")
    page.goto(f"{quiet_dashboard.url}/ui/pools?backend=slurm")
    expect(page.locator("#pools-table tbody tr")).to_have_count(0)
    expect(page.get_by_text("No pool matches these filters.")).to_be_visible()
