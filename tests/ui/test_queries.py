"""The store queries the dashboard added, on SQLite and PostgreSQL: GPU-kind and time filters,
oldest-first keyset pages, per-status counts bounded by a cap, and the admin priority change."""

from __future__ import annotations

from datetime import timedelta

import pytest

from service.store.job_sort import JobSort
from service.store.jobs import JobFilter, count_jobs_by_status, list_events, list_jobs, set_priority, visible_job
from service.store.models import Job, utcnow
from service.store.tokens import Conflict, NotFound, Principal
from service.store.vocab import JobStatus, Role
from tests.db_fixtures import Env
from tests.specs import tiny

ADMIN = Principal(token_id="admin", role=Role.ADMIN)


def submit(env: Env, headers: dict[str, str], count: int, **sections: object) -> list[int]:
    ids = []
    for _ in range(count):
        answer = env.client.post("/v1/jobs", json=tiny(**sections), headers=headers)
        assert answer.status_code == 201, answer.text
        ids.append(answer.json()["id"])
    return ids


def test_filters_pages_and_capped_counts(env: Env, admin: dict[str, str]) -> None:
    ids = submit(env, admin, 5)
    with env.app.state.sessions.begin() as session:
        for job_id, status in zip(ids, [JobStatus.FAILED, JobStatus.FAILED, JobStatus.RUNNING,
                                        JobStatus.QUEUED, JobStatus.QUEUED], strict=True):
            session.get(Job, job_id).status = status  # type: ignore[union-attr]
    with env.app.state.sessions.begin() as session:
        assert count_jobs_by_status(session, ADMIN, JobFilter()) == (
            {JobStatus.FAILED: 2, JobStatus.RUNNING: 1, JobStatus.QUEUED: 2}, False)
        # the status filter narrows the list, not the counts (they are what the filter chooses from)
        assert count_jobs_by_status(session, ADMIN, JobFilter(status=[JobStatus.RUNNING]))[0][JobStatus.FAILED] == 2
        # capped: the newest 3 are counted, and it says more match
        assert count_jobs_by_status(session, ADMIN, JobFilter(), cap=3) == (
            {JobStatus.RUNNING: 1, JobStatus.QUEUED: 2}, True)
        assert count_jobs_by_status(session, ADMIN, JobFilter(), cap=5)[1] is False
        assert [j.id for j in list_jobs(session, ADMIN, JobFilter(gpu="cpu"), limit=10)[0]] == ids[::-1]
        assert list_jobs(session, ADMIN, JobFilter(gpu="H100-SXM-80GB"))[0] == []
        oldest = JobSort.parse("submitted")
        page, cursor = list_jobs(session, ADMIN, JobFilter(), limit=2, sort=oldest)
        assert [j.id for j in page] == ids[:2] and cursor is not None and cursor.id == ids[1]
        rest, _ = list_jobs(session, ADMIN, JobFilter(), limit=10, cursor=cursor, sort=oldest)
        assert [j.id for j in rest] == ids[2:]
        now = utcnow()
        assert len(list_jobs(session, ADMIN, JobFilter(created_after=now - timedelta(hours=1)))[0]) == 5
        assert list_jobs(session, ADMIN, JobFilter(created_before=now - timedelta(hours=1)))[0] == []


def test_a_priority_change_is_an_event_and_ended_jobs_refuse_it(env: Env, admin: dict[str, str]) -> None:
    member = env.headers(env.token("member", team="vision"))
    job_id, ended = submit(env, member, 2)
    env.client.post(f"/v1/jobs/{ended}/cancel", headers=member)
    with env.app.state.sessions.begin() as session:
        set_priority(session, ADMIN, job_id, 700)
    assert env.client.get(f"/v1/jobs/{job_id}", headers=member).json()["priority"] == 700
    with env.app.state.sessions.begin() as session:
        events = list_events(session, visible_job(session, ADMIN, job_id))
        assert events[-1].kind == "job.priority" and events[-1].data == {"from": 0, "to": 700}
        with pytest.raises(Conflict, match="has ended"):
            set_priority(session, ADMIN, ended, 5)
        with pytest.raises(NotFound):
            set_priority(session, Principal(token_id="m", role=Role.MEMBER, team_id=999), job_id, 5)
