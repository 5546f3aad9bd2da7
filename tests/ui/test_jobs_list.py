"""The Jobs page on a server without a dispatcher (jobs stay QUEUED): pages of 50 on the keyset,
filters applied by htmx without a reload, status counts, sorting, team scoping; and /docs and
/redoc loading every asset from the server (air-gapped)."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest

from tests.specs import tiny
from tests.ui.conftest import Dashboard, expect, run_axe, screenshots, sign_in

VISION_JOBS, AUDIO_JOBS = 48, 3  # 51: one page of 50 and one more


@pytest.fixture(scope="module")
def seeded(quiet_dashboard: Dashboard) -> dict[str, list[int]]:
    ids: dict[str, list[int]] = {"vision": [], "audio": []}
    for team, count, name in (("vision", VISION_JOBS, "train"), ("audio", AUDIO_JOBS, "speech")):
        with quiet_dashboard.api(quiet_dashboard.token("member", team=team)) as api:
            for _ in range(count):
                answer = api.post("/v1/jobs", json=tiny(name=name))
                assert answer.status_code == 201, answer.text
                ids[team].append(answer.json()["id"])
    return ids


def row_ids(page: Any) -> list[int]:
    return [int(i.removeprefix("job-row-")) for i in
            page.locator("#job-rows tr").evaluate_all("rows => rows.map(r => r.id)")]


def test_pages_filters_counts_and_sorting(quiet_dashboard: Dashboard, seeded: dict[str, list[int]],
                                          page: Any) -> None:
    everyone = seeded["vision"] + seeded["audio"]
    sign_in(page, quiet_dashboard.url, quiet_dashboard.token("admin"))
    first = row_ids(page)
    assert first == sorted(everyone, reverse=True)[:50]  # newest first, one page of 50
    expect(page.locator("#job-counts")).to_contain_text(f"all: {len(everyone)}")
    page.get_by_role("link", name="Next page").click()
    assert row_ids(page) == sorted(everyone, reverse=True)[50:]
    expect(page.get_by_role("link", name="Next page")).to_have_count(0)

    page.goto(f"{quiet_dashboard.url}/ui/jobs")
    page.evaluate("window.__notReloaded = true")
    page.get_by_label("Team").fill("audio")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator("#job-rows tr")).to_have_count(AUDIO_JOBS)
    assert page.evaluate("window.__notReloaded") is True  # htmx swapped the results in place
    assert "team=audio" in page.url  # ... and the address says what is shown
    expect(page.locator("#job-counts")).to_contain_text(f"all: {AUDIO_JOBS}")
    assert run_axe(page) == []
    screenshots(page, "jobs-filtered")

    page.get_by_role("link", name="Submitted (sort ascending)").click()
    page.wait_for_url(re.compile("sort=submitted"))
    assert row_ids(page) == sorted(seeded["audio"]) and "team=audio" in page.url  # the filter is kept

    page.goto(f"{quiet_dashboard.url}/ui/jobs?status=SUCCEEDED")
    expect(page.get_by_text("No jobs match these filters.")).to_be_visible()
    page.goto(f"{quiet_dashboard.url}/ui/jobs?gpu=cpu&name=speech")
    assert sorted(row_ids(page)) == sorted(seeded["audio"])
    page.goto(f"{quiet_dashboard.url}/ui/jobs?gpu=H100-SXM-80GB")
    assert row_ids(page) == []
    page.goto(f"{quiet_dashboard.url}/ui/jobs?since=2000-01-01&until=2000-01-02")
    assert row_ids(page) == []

    page.goto(f"{quiet_dashboard.url}/ui/jobs?status=NOPE&name=speech")
    alert = page.get_by_role("alert")
    expect(alert).to_contain_text("status: Input should be 'QUEUED'")  # the field and what it accepts
    assert len(row_ids(page)) == AUDIO_JOBS  # the other filters still apply


def sort_state(page: Any) -> dict[str, str]:
    """Column header text -> its aria-sort, for the columns that have one."""
    return dict(page.locator("thead th[aria-sort]").evaluate_all(
        "ths => ths.map(th => [th.querySelector('a').firstChild.textContent.trim(), th.getAttribute('aria-sort')])"))


def test_sorting_by_a_column_header_pages_in_that_order(quiet_dashboard: Dashboard, seeded: dict[str, list[int]],
                                                        page: Any) -> None:
    sign_in(page, quiet_dashboard.url, quiet_dashboard.token("admin"))
    assert sort_state(page) == {"Submitted": "descending"}
    page.get_by_role("link", name="Team (sort ascending)").click()
    page.wait_for_url(re.compile(r"sort=team(&|$)"))
    assert sort_state(page) == {"Team": "ascending"}
    expect(page.locator("caption")).to_contain_text("team, A to Z")
    # audio before vision, each team's jobs by id: across the two pages, every job once
    shown = row_ids(page)
    page.get_by_role("link", name="Next page").click()
    page.wait_for_url(re.compile("cursor="))
    shown += row_ids(page)
    assert shown == sorted(seeded["audio"]) + sorted(seeded["vision"])

    page.get_by_role("link", name="Team (sort descending)").click()
    page.wait_for_url(re.compile("sort=-team"))
    assert sort_state(page) == {"Team": "descending"}
    assert row_ids(page) == sorted(seeded["vision"], reverse=True) + sorted(seeded["audio"], reverse=True)[:2]
    assert run_axe(page) == []

    # a cursor of another sort is not used: the first page shows, and the page says why
    page.goto(f"{quiet_dashboard.url}/ui/jobs?sort=name&cursor=5")
    expect(page.get_by_role("alert")).to_contain_text("cursor: this cursor pages sort=-submitted")
    assert row_ids(page)[:3] == sorted(seeded["audio"])  # speech < train, first page


def test_a_member_sees_their_team_only(quiet_dashboard: Dashboard, seeded: dict[str, list[int]], page: Any) -> None:
    sign_in(page, quiet_dashboard.url, quiet_dashboard.token("member", team="audio"))
    assert sorted(row_ids(page)) == sorted(seeded["audio"])
    expect(page.locator("#job-counts")).to_contain_text(f"all: {AUDIO_JOBS}")
    expect(page.get_by_label("Team")).to_have_count(0)
    page.goto(f"{quiet_dashboard.url}/ui/jobs?team=vision")  # another team's filter finds nothing
    assert row_ids(page) == []


def test_api_docs_load_every_asset_from_the_server(quiet_dashboard: Dashboard) -> None:
    """/docs and /redoc work air-gapped: every script, style and icon they name is a path on this
    server, and the server answers each."""
    with httpx.Client(base_url=quiet_dashboard.url) as client:
        for path in ("/docs", "/redoc"):
            html = client.get(path)
            assert html.status_code == 200
            quoted = r"""["']([^"']+)["']"""
            assets = re.findall(r"(?:src|href)=" + quoted, html.text)
            assets += re.findall(r"(?:url|spec-url)\s*[:=]\s*" + quoted, html.text)
            assert assets, html.text
            for asset in assets:
                assert asset.startswith("/") and not asset.startswith("//"), f"{path} loads {asset} from elsewhere"
                assert client.get(asset).status_code == 200, asset
