"""Data the page tests share: a small local pool, two teams with quotas that make jobs wait, queued jobs,
and the dispatcher's queue view written after them (its queue-view step, `workers.queue_view`).

Built through the API (pools, quotas, jobs) on a `quiet_dashboard` (no dispatcher: jobs stay QUEUED,
so the queue holds still while a test reads it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from service.store.models import Attempt, utcnow
from service.store.vocab import AttemptStatus
from tests.specs import tiny
from tests.ui.conftest import Dashboard
from workers.queue_view import QueueViewWriter

POOL = "cpu-small"


@dataclass
class World:
    admin: str
    vision: str  # a member token of team vision
    audio: str  # a member token of team audio
    jobs: dict[str, list[int]] = field(default_factory=dict)  # team -> job ids, in submission order


def one_slot(name: str) -> dict[str, object]:
    """The tiny spec on one CPU process (one slot of the pool)."""
    return tiny(name=name, resources={"gpus_per_node": 1})


def build(dashboard: Dashboard, *, vision_jobs: int = 3, audio_jobs: int = 2) -> World:
    world = World(admin=dashboard.token("admin"), vision=dashboard.token("member", team="vision"),
                  audio=dashboard.token("member", team="audio"))
    with dashboard.api(world.admin) as api:
        answer = api.put(f"/v1/pools/{POOL}", json={"backend": "local", "gpu": "cpu", "gpus": 2})
        assert answer.status_code in (200, 201), answer.text
        for team in ("vision", "audio"):  # one slot each, nothing borrowed: the rest waits on quota
            answer = api.put(f"/v1/teams/{team}/quota",
                             json={"flavors": {"cpu": {"nominal": 1, "borrowing_limit": 0}}})
            assert answer.status_code == 200, answer.text
    for team, token, count in (("vision", world.vision, vision_jobs), ("audio", world.audio, audio_jobs)):
        with dashboard.api(token) as api:
            for n in range(count):
                answer = api.post("/v1/jobs", json=one_slot(f"{team}-run-{n}"))
                assert answer.status_code == 201, answer.text
                world.jobs.setdefault(team, []).append(answer.json()["id"])
    return world


def refresh_queue_view(dashboard: Dashboard) -> None:
    """What the dispatcher does after each cycle: write the queue view."""
    assert QueueViewWriter(dashboard.sessions).maybe_refresh()


def ran_for_an_hour(dashboard: Dashboard, job_id: int) -> None:
    """An attempt of the job that ran from 2 h ago to 1 h ago (as a job preempted and requeued since):
    one slot for one hour of usage."""
    now = utcnow()
    with dashboard.sessions.begin() as session:
        session.add(Attempt(job_id=job_id, number=1, backend_name="local", status=AttemptStatus.PREEMPTED,
                            started_at=now - timedelta(hours=2), finished_at=now - timedelta(hours=1)))
