"""The dashboard's pure parts, without a browser: formatting, chart scaling, the Jobs query's links,
and the sign-in redirect that never leaves the dashboard."""

from __future__ import annotations

import html
import re
from datetime import UTC, datetime

import pytest

from service.api.ui.charts import HEIGHT, PAD_BOTTOM, PAD_LEFT, PAD_RIGHT, PAD_TOP, WIDTH, series
from service.api.ui.limits import MAX_FORM_BYTES
from service.api.ui.render import duration, human_bytes
from service.api.ui.routers.auth import HOME, _safe_next
from service.api.ui.routers.jobs import JobsQuery
from tests.db_fixtures import Env
from tests.specs import tiny


@pytest.mark.parametrize(("seconds", "shown"), [(0.25, "0.25 s"), (4.56, "4.6 s"), (65, "1 min 05 s"),
                                                (7322, "2 h 02 min"), (90000, "1 d 1 h"), (None, "-")])
def test_durations_read_as_people_write_them(seconds: float | None, shown: str) -> None:
    assert duration(seconds) == shown


def test_bytes_use_binary_units() -> None:
    assert human_bytes(512) == "512 B" and human_bytes(3 * 2**30) == "3.0 GiB"


def test_a_series_spans_the_chart_box_and_drops_non_finite_points() -> None:
    line = series("Loss", [1, 2, 3, 4], [4.0, float("nan"), 2.0, 1.0])
    assert line is not None and line.count == 3 and (line.y_min, line.y_max) == (1.0, 4.0)
    xs = [float(p.split(",")[0]) for p in line.points.split()]
    ys = [float(p.split(",")[1]) for p in line.points.split()]
    assert xs[0] == PAD_LEFT and xs[-1] == WIDTH - PAD_RIGHT
    assert ys[0] == PAD_TOP and ys[-1] == HEIGHT - PAD_BOTTOM  # the largest value on top
    assert series("Loss", [1], [1.0]) is None


def test_the_jobs_query_keeps_its_filters_in_links_and_reads_dates_as_whole_days() -> None:
    query = JobsQuery.model_validate({"status": ["RUNNING"], "team": "vision", "since": "2026-11-30",
                                      "until": "2026-12-01", "sort": "newest", "cursor": ""})
    assert query.since == datetime(2026, 11, 30, tzinfo=UTC)
    assert query.until == datetime(2026, 12, 2, tzinfo=UTC)  # the last day is included
    assert query.until_input() == "2026-12-01"
    assert query.sort == "-submitted"  # `newest`, from before there were other sorts
    link = query.url(sort="-gpus", cursor=None)
    again = JobsQuery.model_validate({"status": ["RUNNING"], "team": "vision", "since": "2026-11-30T00:00:00Z",
                                      "until": "2026-12-02T00:00:00Z", "sort": "-gpus"})
    assert link.startswith("/ui/jobs?") and "status=RUNNING" in link and "team=vision" in link
    assert "sort=-gpus" in link and "cursor" not in link and again.filters().team == "vision"


def test_sort_headers_flip_the_current_column_and_keep_the_filters() -> None:
    query = JobsQuery.model_validate({"team": "vision", "sort": "-gpus", "cursor": "abc"})
    gpus, name = query.header("gpus"), query.header("name")
    assert gpus.aria_sort == "descending" and gpus.action == "sort ascending"
    assert "sort=gpus" in gpus.href and "team=vision" in gpus.href and "cursor" not in gpus.href
    assert name.aria_sort is None and "sort=name" in name.href and name.action == "sort ascending"
    assert query.header("finished").action == "sort descending"  # times and counts start biggest first
    newest = JobsQuery.model_validate({})
    assert newest.header("submitted").aria_sort == "descending" and "sort=submitted" in newest.header("submitted").href


@pytest.mark.parametrize("target", ["https://evil.example/ui/jobs", "//evil.example/ui/jobs", "/v1/jobs",
                                    "/ui\\..\\x", None, ""])
def test_sign_in_only_returns_to_dashboard_pages(target: str | None) -> None:
    assert _safe_next(target) == HOME


def test_sign_in_returns_to_the_page_asked_for() -> None:
    assert _safe_next("/ui/jobs/12?x=1") == "/ui/jobs/12?x=1"


def test_every_profile_verdict_has_words() -> None:
    from typing import get_args

    from service.api.ui.routers.job import VERDICTS
    from service.profiles.models import Bound

    assert set(VERDICTS) == set(get_args(Bound))


def test_dashboard_posts_are_small_url_encoded_forms(env: Env) -> None:
    big = env.client.post("/ui/login", data={"token": "x" * (MAX_FORM_BYTES + 10)})
    assert big.status_code == 413
    upload = env.client.post("/ui/login", files={"token": ("t.txt", b"shc_x")})
    assert upload.status_code == 415 and "application/x-www-form-urlencoded" in upload.text
    assert env.client.post("/ui/login", data={"token": "shc_x"}).status_code == 403  # small: read (no form token)


def test_the_job_page_narrows_its_live_logs_to_one_rank(env: Env) -> None:
    admin = env.token("admin")
    made = env.client.post("/v1/jobs", json=tiny(name="ranks", resources={"gpus_per_node": 2}),
                           headers=env.headers(admin))
    assert made.status_code == 201, made.text
    job_id = made.json()["id"]
    env.sign_in_ui(admin)
    merged = env.client.get(f"/ui/jobs/{job_id}", params={"rank": ""})  # the form's "every rank"
    assert merged.status_code == 200
    assert f'data-live="/ui/jobs/{job_id}/logs/live"' in merged.text and "every rank, merged" in merged.text
    one = env.client.get(f"/ui/jobs/{job_id}", params={"rank": "1"})
    assert f'data-live="/ui/jobs/{job_id}/logs/live?rank=1"' in one.text
    assert '<option value="1" selected>rank 1</option>' in one.text
    assert env.client.get(f"/ui/jobs/{job_id}", params={"rank": "one"}).status_code == 422


def test_the_job_pages_live_stream_sends_only_what_came_after_the_page(env: Env) -> None:
    """Sections re-rendered when the stream starts would replace a form being filled in (the admin's
    priority field): the stream starts from the page's own newest event and heartbeat."""
    admin = env.token("admin")
    job_id = env.client.post("/v1/jobs", json=tiny(name="live"), headers=env.headers(admin)).json()["id"]
    beat = env.client.post(f"/v1/jobs/{job_id}/measurements", headers=env.headers(admin),
                           json={"kind": "heartbeat", "data": {"step": 1, "loss": 2.0}})
    assert beat.status_code == 201, beat.text
    assert env.client.post(f"/v1/jobs/{job_id}/cancel", headers=env.headers(admin)).status_code == 200
    env.sign_in_ui(admin)
    page = env.client.get(f"/ui/jobs/{job_id}").text
    live = re.search(r'id="job-page" data-live="([^"]+)"', page)
    assert live is not None
    url = html.unescape(live.group(1))
    assert "&beat=" in url and not url.endswith("&beat=0")
    stream = env.client.get(url).text  # the job has ended: the stream ends once all is sent
    assert "event: html" not in stream and "event: end" in stream
    from_nothing = env.client.get(url.split("&beat=")[0]).text  # a page that had seen no heartbeat
    assert "event: html" in from_nothing and "job-overview" in from_nothing
