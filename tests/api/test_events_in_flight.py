"""A feed cursor never skips an event that commits after a later one: on PostgreSQL an event's id
is taken when its row is inserted and becomes visible when its transaction commits, so ids can appear
out of order. Readers stop before a young gap in ids (`committed_horizon`); an old gap is a rolled-back
insert and is passed. SQLite writes one transaction at a time: no horizon there."""

from __future__ import annotations

import pytest

from service.store import event_feed
from service.store.models import Job
from service.store.states import add_event
from tests.db_fixtures import Env
from tests.specs import tiny


def _ids(env: Env, headers: dict[str, str], since: int, job_id: int) -> tuple[list[int], list[int]]:
    feed = env.client.get("/v1/events", params={"since": since}, headers=headers).json()["items"]
    per_job = env.client.get(f"/v1/jobs/{job_id}/events", headers=headers).json()
    return [e["id"] for e in feed], [e["id"] for e in per_job if e["id"] > since]


def _event(session: object, job_id: int, kind: str) -> int:
    job = session.get(Job, job_id)  # type: ignore[attr-defined]
    event = add_event(session, job, actor="test", kind=kind, message=kind)  # type: ignore[arg-type]
    session.flush()  # type: ignore[attr-defined]
    return int(event.id)


def test_a_cursor_waits_for_an_event_still_in_flight(env: Env, admin: dict[str, str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    r = env.client.post("/v1/jobs", json=tiny(name="feed"), headers=admin)
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    sessions = env.app.state.sessions
    with sessions() as session:
        last = max(e["id"] for e in env.client.get(f"/v1/jobs/{job_id}/events", headers=admin).json())
        if not env.url.startswith("postgresql"):
            assert event_feed.committed_horizon(session) is None  # one writer at a time: ids appear in order
            return
    slow = sessions()
    slow.begin()
    early = _event(slow, job_id, "test.early")  # id taken, not committed
    with sessions.begin() as fast:
        late = _event(fast, job_id, "test.late")  # a later id, committed first
    assert late > early > last
    assert _ids(env, admin, last, job_id) == ([], [])  # neither reader moves past the early one's id
    slow.commit()
    slow.close()
    assert _ids(env, admin, last, job_id) == ([early, late], [early, late])

    # an insert rolled back leaves a gap for good: readers wait IN_FLIGHT_S, then pass it
    gone = sessions()
    gone.begin()
    _event(gone, job_id, "test.rolled-back")
    gone.rollback()
    gone.close()
    with sessions.begin() as fast:
        after = _event(fast, job_id, "test.after-gap")
    assert _ids(env, admin, late, job_id) == ([], [])
    monkeypatch.setattr(event_feed, "IN_FLIGHT_S", 0.0)
    assert _ids(env, admin, late, job_id) == ([after], [after])
