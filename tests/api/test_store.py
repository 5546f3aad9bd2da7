"""The store on both databases: migrations, the state machine, events in the same transaction."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from service.lifecycle import ALLOWED, TERMINAL
from service.planner import plan
from service.spec import TrainingSpec
from service.store import migrate
from service.store.db import make_engine, make_sessionmaker
from service.store.jobs import NewJob
from service.store.models import Event, Job
from service.store.states import IllegalTransition, JobStatus, transition
from service.store.submissions import insert_jobs
from service.store.tokens import Principal, ensure_team
from service.store.visibility import can_see, visible_to
from service.store.vocab import Role
from tests.specs import tiny


def test_migrations_go_up_down_up_without_drift(db_url: str) -> None:
    assert migrate.current_revision(db_url) is not None
    assert migrate.drift(db_url) == []
    migrate.downgrade(db_url, "base")
    assert migrate.current_revision(db_url) is None
    migrate.upgrade(db_url)
    assert migrate.drift(db_url) == []


@pytest.fixture
def sessions(db_url: str):
    engine = make_engine(db_url)
    yield make_sessionmaker(engine)
    engine.dispose()


SPEC = TrainingSpec.model_validate(tiny(name="j"))
PLAN = plan(SPEC)


def _job(sessions) -> int:
    with sessions.begin() as session:
        team = ensure_team(session, "alpha")
        [job] = insert_jobs(session, [NewJob(team=team, spec=SPEC, plan=PLAN)], actor="test")
        return job.id


def test_spec_and_plan_read_back_as_the_models_written(sessions) -> None:
    job_id = _job(sessions)
    with sessions.begin() as session:
        job = session.get(Job, job_id)
        assert job.spec == SPEC and job.plan == PLAN
        assert job.status is JobStatus.QUEUED and job.layout == PLAN.layout.short()


def test_every_transition_the_machine_allows_and_refuses(sessions) -> None:
    for current, allowed in ALLOWED.items():
        for wanted in JobStatus:
            job_id = _job(sessions)
            with sessions.begin() as session:
                job = session.get(Job, job_id)
                job.status = current.value
            with sessions.begin() as session:
                job = session.get(Job, job_id)
                if wanted in allowed:
                    event = transition(session, job, wanted, actor="test")
                    assert event.kind == f"job.{wanted.lower()}"
                else:
                    with pytest.raises(IllegalTransition):
                        transition(session, job, wanted, actor="test")


def test_terminal_states_are_final(sessions) -> None:
    for status in TERMINAL:
        assert ALLOWED[status] == frozenset()
    job_id = _job(sessions)
    with sessions.begin() as session:
        job = session.get(Job, job_id)
        transition(session, job, JobStatus.CANCELLED, actor="test")
        assert job.finished_at is not None
    with sessions.begin() as session, pytest.raises(IllegalTransition, match="terminal states are final"):
        transition(session, session.get(Job, job_id), JobStatus.QUEUED, actor="test")


def test_a_transition_and_its_event_commit_or_roll_back_together(sessions) -> None:
    job_id = _job(sessions)

    def count() -> int:
        with sessions.begin() as session:
            return session.scalar(select(func.count()).select_from(Event).where(Event.job_id == job_id))

    before = count()
    with pytest.raises(RuntimeError), sessions.begin() as session:
        transition(session, session.get(Job, job_id), JobStatus.SUBMITTING, actor="dispatcher")
        raise RuntimeError("crash before commit")
    with sessions.begin() as session:
        assert session.get(Job, job_id).status == "QUEUED"
    assert count() == before
    with sessions.begin() as session:
        transition(session, session.get(Job, job_id), JobStatus.SUBMITTING, actor="dispatcher")
    assert count() == before + 1


def test_migration_0002_backfills_the_list_columns_from_existing_plans(db_url: str) -> None:
    import sqlalchemy as sa

    migrate.downgrade(db_url, "0001")
    engine = sa.create_engine(db_url)
    plan = {"layout": PLAN.layout.to_dict(), "time": {"step_s": 1.25}}
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO teams (name, created_at) VALUES ('alpha', CURRENT_TIMESTAMP)"))
        team_id = conn.execute(sa.text("SELECT id FROM teams")).scalar_one()
        jobs = sa.table("jobs", *(sa.column(c) for c in ("name", "team_id", "status", "backend", "priority",
                                                          "created_by", "created_at", "updated_at")),
                        sa.column("spec", sa.JSON()), sa.column("plan", sa.JSON()))
        conn.execute(jobs.insert().values(name="old", team_id=team_id, status="QUEUED", backend="local", priority=0,
                                          created_by="t", created_at=sa.func.now(), updated_at=sa.func.now(),
                                          spec={}, plan=plan))
    migrate.upgrade(db_url)
    with engine.begin() as conn:
        layout, step = conn.execute(sa.text("SELECT layout, predicted_step_s FROM jobs")).one()
    engine.dispose()
    assert layout == PLAN.layout.short() and step == 1.25  # the line rows written since get


def test_a_role_the_visibility_rule_does_not_know_sees_no_job(sessions) -> None:
    job_id = _job(sessions)
    with sessions.begin() as session:
        job = session.get(Job, job_id)
        stranger = Principal(token_id="t", role="robot")  # type: ignore[arg-type]
        admin = Principal(token_id="a", role=Role.ADMIN)
        assert not can_see(stranger, job)
        assert session.scalars(visible_to(select(Job.id), stranger)).all() == []
        assert session.scalars(visible_to(select(Job.id), admin)).all() == [job.id]
