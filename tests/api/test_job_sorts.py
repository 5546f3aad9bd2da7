"""Sorting the job list (`GET /v1/jobs?sort=`, the store's `list_jobs`), on SQLite and PostgreSQL:
every sort pages by keyset so that each matching job comes exactly once, in the sort's order with
ties broken by the id; a cursor only works with the sort that gave it out."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy.exc import StatementError

from service.store.job_sort import DEFAULT_SORT, SORT_TEXTS, After, JobSort
from service.store.jobs import _JOBS, JobFilter, _page_statements, list_job_rows, list_jobs
from service.store.models import Job
from service.store.tokens import Principal, ensure_team
from service.store.vocab import JobStatus, Role
from tests.db_fixtures import Env
from tests.specs import tiny

# Lowercase names and teams: they order the same in Python and in every database collation.
NAMES = ["beta", "alpha", "beta", "gamma", "alpha", "beta", "alpha", "delta", "beta", "gamma", "alpha"]
TEAMS = ["vision", "nlp", "audio", "nlp", "vision", "nlp", "audio", "vision", "nlp", "nlp", "audio"]
GPUS = [8, 1, 4, 8, 2, 1, 8, 4, 1, 2, 8]
STATUSES = [JobStatus.RUNNING, JobStatus.QUEUED, JobStatus.FAILED, JobStatus.SUCCEEDED, JobStatus.QUEUED,
            JobStatus.RUNNING, JobStatus.SUCCEEDED, JobStatus.CANCELLED, JobStatus.QUEUED, JobStatus.FAILED,
            JobStatus.SUCCEEDED]
BASE = datetime(2026, 11, 30, 12, 0, 0, 123456, tzinfo=UTC)
# None: not finished. Two pairs of equal times, to see ties go by id.
FINISHED: list[timedelta | None] = [None, None, timedelta(hours=3), timedelta(hours=1), None,
                                    None, timedelta(hours=1), timedelta(hours=2), None, timedelta(hours=3),
                                    timedelta(minutes=30)]


def _key(row: dict[str, Any], field: str) -> Any:
    if field == "finished":  # not finished counts as later than any finish time
        return (row["finished"] is None, row["finished"] or BASE)
    return row[field]


def expected(rows: list[dict[str, Any]], sort: str) -> list[int]:
    field = sort.removeprefix("-")
    if field == "submitted":
        order = sorted(rows, key=lambda r: r["id"])
    else:
        order = sorted(rows, key=lambda r: (_key(r, field), r["id"]))
    return [r["id"] for r in (order[::-1] if sort.startswith("-") else order)]


@pytest.fixture
def jobs(env: Env, admin: dict[str, str]) -> list[dict[str, Any]]:
    """Eleven jobs with duplicate names, teams, GPU counts, statuses and finish times."""
    ids = []
    for _ in NAMES:
        answer = env.client.post("/v1/jobs", json=tiny(), headers=admin)
        assert answer.status_code == 201, answer.text
        ids.append(answer.json()["id"])
    rows = []
    with env.app.state.sessions.begin() as session:
        teams = {name: ensure_team(session, name) for name in set(TEAMS)}
        for i, job_id in enumerate(ids):
            job = session.get(Job, job_id)
            assert job is not None
            job.name, job.team_id, job.gpus, job.status = NAMES[i], teams[TEAMS[i]].id, GPUS[i], STATUSES[i]
            job.finished_at = BASE + FINISHED[i] if FINISHED[i] is not None else None
            rows.append({"id": job_id, "name": NAMES[i], "team": TEAMS[i], "gpus": GPUS[i],
                         "status": STATUSES[i].value, "finished": job.finished_at})
    return rows


def pages(env: Env, headers: dict[str, str], sort: str, limit: int, **params: str) -> list[list[int]]:
    """Every page of `GET /v1/jobs` in `sort`, following next_cursor to the end."""
    out: list[list[int]] = []
    cursor: str | None = None
    while True:
        query = {"sort": sort, "limit": str(limit), **params, **({"cursor": cursor} if cursor else {})}
        answer = env.client.get("/v1/jobs", params=query, headers=headers)
        assert answer.status_code == 200, answer.text
        out.append([item["id"] for item in answer.json()["items"]])
        cursor = answer.json()["next_cursor"]
        if cursor is None:
            return out
        assert len(out) <= len(NAMES), "the cursor does not advance"


@pytest.mark.parametrize("limit", [1, 3])
def test_every_sort_pages_each_job_once_in_order(env: Env, admin: dict[str, str], jobs: list[dict[str, Any]],
                                                 limit: int) -> None:
    for sort in SORT_TEXTS:
        got = pages(env, admin, sort, limit)
        assert all(len(page) == limit for page in got[:-1]), (sort, got)
        assert [i for page in got for i in page] == expected(jobs, sort), sort


def test_sorts_with_filters_and_a_member_see_only_their_rows(env: Env, admin: dict[str, str],
                                                             jobs: list[dict[str, Any]]) -> None:
    nlp = [r for r in jobs if r["team"] == "nlp"]
    for sort in ("-gpus", "name", "status", "-finished", "team"):
        assert [i for p in pages(env, admin, sort, 2, team="nlp") for i in p] == expected(nlp, sort), sort
    queued = [r for r in jobs if r["status"] == "QUEUED"]
    assert [i for p in pages(env, admin, "-gpus", 2, status="QUEUED") for i in p] == expected(queued, "-gpus")
    member = env.headers(env.token("member", team="vision"))
    vision = [r for r in jobs if r["team"] == "vision"]
    for sort in ("gpus", "-name", "finished", "-team"):
        assert [i for p in pages(env, member, sort, 2) for i in p] == expected(vision, sort), sort


def test_the_store_function_takes_the_same_sorts(env: Env, jobs: list[dict[str, Any]]) -> None:
    admin = Principal(token_id="admin", role=Role.ADMIN)
    with env.app.state.sessions.begin() as session:
        rows, cursor = list_jobs(session, admin, JobFilter(), limit=4, sort=JobSort.parse("-gpus"))
        assert [j.id for j in rows] == expected(jobs, "-gpus")[:4] and cursor is not None
        rest, end = list_jobs(session, admin, JobFilter(), limit=50, sort=cursor.sort, cursor=cursor)
        assert [j.id for j in rest] == expected(jobs, "-gpus")[4:] and end is None
        newest, _ = list_jobs(session, admin, JobFilter(), limit=50)
        assert [j.id for j in newest] == expected(jobs, DEFAULT_SORT.text)


@pytest.mark.parametrize("who", ["admin", "member"])
def test_the_api_lists_rows_as_the_dashboard_lists_jobs(env: Env, jobs: list[dict[str, Any]], who: str) -> None:
    """`GET /v1/jobs` reads rows of the list's columns (`list_job_rows`), the dashboard ORM objects
    (`list_jobs`): for every sort, the same jobs, teams and cursors, page after page."""
    with env.app.state.sessions.begin() as session:
        team = ensure_team(session, "nlp")
        principal = Principal(token_id="t", role=Role.ADMIN) if who == "admin" else \
            Principal(token_id="t", role=Role.MEMBER, team_id=team.id, team_name="nlp")
        for sort in SORT_TEXTS:
            order, cursor, seen = JobSort.parse(sort), None, 0
            while True:
                objects, after = list_jobs(session, principal, JobFilter(), limit=3, sort=order, cursor=cursor)
                rows, row_after = list_job_rows(session.connection(), principal, JobFilter(), limit=3, sort=order,
                                                cursor=cursor)
                assert [(j.id, j.team.name, j.gpus) for j in objects] == \
                    [(r.id, r.team_name, r.gpus) for r in rows], sort
                assert after == row_after, sort
                seen += len(rows)
                if after is None:
                    break
                cursor = after
            assert seen == sum(1 for r in jobs if who == "admin" or r["team"] == "nlp"), sort


def test_a_bad_sort_or_a_cursor_of_another_sort_is_a_422(env: Env, admin: dict[str, str],
                                                         jobs: list[dict[str, Any]]) -> None:
    bad = env.client.get("/v1/jobs", params={"sort": "gpu"}, headers=admin)
    assert bad.status_code == 422
    error = bad.json()["error"]
    assert "sort" in error["fields"][0]["loc"] and "'-gpus'" in error["fields"][0]["message"]
    first = env.client.get("/v1/jobs", params={"sort": "-gpus", "limit": "2"}, headers=admin).json()
    cursor = first["next_cursor"]
    other = env.client.get("/v1/jobs", params={"sort": "name", "cursor": cursor}, headers=admin)
    assert other.status_code == 422
    assert "sort=-gpus" in other.json()["error"]["message"] and other.json()["error"]["fields"][0]["loc"] == \
        "query.cursor"
    newest = env.client.get("/v1/jobs", params={"limit": "2"}, headers=admin).json()["next_cursor"]
    assert newest.isdigit()  # the default sort's cursor is still the job id, as before
    assert env.client.get("/v1/jobs", params={"sort": "gpus", "cursor": newest}, headers=admin).status_code == 422
    assert env.client.get("/v1/jobs", params={"cursor": cursor}, headers=admin).status_code == 422
    garbage = env.client.get("/v1/jobs", params={"sort": "gpus", "cursor": "bm90LWpzb24"}, headers=admin)
    assert garbage.status_code == 422 and "cursor" in garbage.json()["error"]["message"]


def test_a_page_statement_built_once_serves_each_request_with_its_own_values(
        env: Env, admin: dict[str, str], jobs: list[dict[str, Any]]) -> None:
    """The list's statements are built once per shape of request (`_page_statements`) and run with each
    request's values: members of two teams, two names and two cursors in a row each get their own rows
    from the same statements; and a run that left a value out fails instead of reusing another's."""
    by_team = {team: env.headers(env.token("member", team=team)) for team in ("vision", "nlp")}
    hits = _page_statements.cache_info().hits
    for team, headers in by_team.items():
        mine = [r for r in jobs if r["team"] == team]
        for sort in ("-submitted", "gpus", "-finished"):
            assert [i for p in pages(env, headers, sort, 2) for i in p] == expected(mine, sort), (team, sort)
    for name in ("alpha", "beta"):
        named = [r for r in jobs if r["name"] == name]
        assert [i for p in pages(env, admin, "-gpus", 1, name=name) for i in p] == expected(named, "-gpus"), name
    assert _page_statements.cache_info().hits > hits
    [statement] = _page_statements(_JOBS, Role.MEMBER, frozenset(), JobSort.parse("gpus"), After.START)
    with env.app.state.sessions.begin() as session, pytest.raises(StatementError, match="visible_team"):
        session.execute(statement, {"limit": 5})
