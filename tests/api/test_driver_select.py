"""The job list read through psycopg's cursor (`DriverSelect`) on PostgreSQL gives what SQLAlchemy's
`Connection.execute` gives: the same rows and cursors, and byte for byte the same page, for every
filter, sort, principal and token check; bound values go through their types; driver errors come as
SQLAlchemy's, and a lost connection is invalidated so that the pool replaces it."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Connection, bindparam, create_engine, event, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, StatementError

from service.api.views import encoded, job_page
from service.backend_options import BackendKind
from service.lifecycle import TERMINAL
from service.store import jobs as store_jobs
from service.store.db import make_engine, one_statement
from service.store.driver_select import DriverSelect, driver_reads
from service.store.job_sort import SORT_TEXTS, After, JobCursor, JobSort
from service.store.jobs import JobFilter, _page_statements, list_job_rows
from service.store.known_tokens import Unproven, live_values
from service.store.models import Job, Team, utcnow
from service.store.tokens import Principal, ensure_team
from service.store.vocab import JobStatus, Role
from tests.db_fixtures import Env
from tests.specs import tiny

TEAMS = ("vision", "nlp", "audio")
NAMES = ("alpha", "beta", "gamma")
STATUSES = (JobStatus.RUNNING, JobStatus.QUEUED, JobStatus.SUCCEEDED, JobStatus.FAILED)
BACKENDS = (BackendKind.LOCAL, BackendKind.SLURM, BackendKind.KUBERNETES)
START = datetime(2026, 12, 1, 9, 30, 0, 250000, tzinfo=UTC)


@pytest.fixture
def seeded(pg_env: Env) -> list[int]:
    """Eighteen jobs spread over teams, names, statuses, backends, GPU counts, submission and finish
    times (with ties) and predicted step times (some none)."""
    admin = pg_env.headers(pg_env.token("admin"))
    ids = []
    for _ in range(18):
        answer = pg_env.client.post("/v1/jobs", json=tiny(), headers=admin)
        assert answer.status_code == 201, answer.text
        ids.append(answer.json()["id"])
    with pg_env.app.state.sessions.begin() as session:
        teams = [ensure_team(session, name) for name in TEAMS]
        for i, job_id in enumerate(ids):
            job = session.get(Job, job_id)
            assert job is not None
            job.team_id, job.name = teams[i % 3].id, NAMES[i // 3 % 3]
            job.status, job.backend, job.gpus = STATUSES[i % 4], BACKENDS[i // 2 % 3], (1, 2, 4, 8)[i * 7 % 4]
            job.created_at = START + timedelta(minutes=i // 2)
            job.finished_at = START + timedelta(hours=i % 3) if job.status in TERMINAL else None
            job.predicted_step_s = None if i % 5 == 0 else 0.125 * (i + 1)
    return ids


def _principals(env: Env) -> list[Principal]:
    with env.app.state.sessions.begin() as session:
        nlp = session.query(Team).filter_by(name="nlp").one()
        return [Principal(token_id="admin", role=Role.ADMIN),
                Principal(token_id="member", role=Role.MEMBER, team_id=nlp.id, team_name="nlp")]


FILTERS = [
    JobFilter(),
    JobFilter(status=[JobStatus.RUNNING]),
    JobFilter(status=[JobStatus.QUEUED, JobStatus.FAILED, JobStatus.SUCCEEDED]),
    JobFilter(team="audio"),
    JobFilter(backend=BackendKind.SLURM, status=[JobStatus.RUNNING, JobStatus.QUEUED]),
    JobFilter(name="beta", gpu="cpu"),
    JobFilter(created_after=START + timedelta(minutes=2), created_before=START + timedelta(minutes=6)),
    JobFilter(created_after=(START + timedelta(minutes=3)).replace(tzinfo=None)),  # naive: read as UTC
]


def _read(conn: Connection, principal: Principal, filters: JobFilter, sort: JobSort,
          cursor: JobCursor | None, *, driver: bool, monkeypatch: pytest.MonkeyPatch
          ) -> tuple[list[Any], JobCursor | None]:
    with monkeypatch.context() as patched:
        if not driver:
            patched.setattr(store_jobs, "driver_reads", lambda _conn: False)
        return list_job_rows(conn, principal, filters, limit=4, cursor=cursor, sort=sort)


def _all_pages(conn: Connection, principal: Principal, filters: JobFilter, sort: JobSort, *, driver: bool,
               monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[list[Any], JobCursor | None]]:
    cursor = None
    for _ in range(20):
        rows, cursor = _read(conn, principal, filters, sort, cursor, driver=driver, monkeypatch=monkeypatch)
        yield rows, cursor
        if cursor is None:
            return
    raise AssertionError("the cursor does not advance")


def test_every_filter_sort_and_principal_pages_as_through_sqlalchemy(
        pg_env: Env, seeded: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    engine = pg_env.app.state.engine
    read_before = DriverSelect.for_dialect.cache_info()
    compared = 0
    with one_statement(engine) as conn:
        assert driver_reads(conn)
        for principal, filters, text_sort in itertools.product(_principals(pg_env), FILTERS, SORT_TEXTS):
            sort = JobSort.parse(text_sort)
            through_driver = list(_all_pages(conn, principal, filters, sort, driver=True, monkeypatch=monkeypatch))
            through_sqlalchemy = list(_all_pages(conn, principal, filters, sort, driver=False,
                                                 monkeypatch=monkeypatch))
            case = (principal.role, filters, text_sort)
            assert len(through_driver) == len(through_sqlalchemy), case
            for (rows, after), (expected_rows, expected_after) in zip(through_driver, through_sqlalchemy,
                                                                       strict=True):
                assert [tuple(r) for r in rows] == [tuple(r) for r in expected_rows], case
                assert [r._fields for r in rows[:1]] == [tuple(r._fields) for r in expected_rows[:1]], case
                assert after == expected_after, case
                page, expected_page = (
                    encoded(job_page(r, a.encode() if a is not None else None))
                    for r, a in ((rows, after), (expected_rows, expected_after)))
                assert page == expected_page, case
                compared += len(rows)
        assert compared > 300  # the cases read rows, not empty pages
        compiled = DriverSelect.for_dialect.cache_info()
        assert compiled.misses > read_before.misses  # the driver read them
        for principal, filters, text_sort in itertools.product(_principals(pg_env), FILTERS, SORT_TEXTS):
            list(_all_pages(conn, principal, filters, JobSort.parse(text_sort), driver=True, monkeypatch=monkeypatch))
    again = DriverSelect.for_dialect.cache_info()
    assert again.misses == compiled.misses and again.hits > compiled.hits  # each shape compiled once


def test_the_token_check_binds_its_values_through_their_types(
        pg_env: Env, seeded: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    """With the token checked in the page's statement (`TOKEN_LIVE`: a role, times, naive ones read as
    UTC), a job token sees its job while the job runs or within the grace after it ends, and is
    `Unproven` after, through the driver as through SQLAlchemy."""
    finished = seeded[2]  # a SUCCEEDED job
    running = seeded[0]
    with pg_env.app.state.sessions.begin() as session:
        finished_at = session.get(Job, finished).finished_at  # type: ignore[union-attr]
    assert finished_at is not None
    grace_s = 3600.0
    tokens = {job_id: pg_env.token("job", job_id=job_id) for job_id in (finished, running)}
    with pg_env.app.state.sessions.begin() as session:
        ids = {job_id: session.execute(text("SELECT id FROM api_tokens WHERE job_id = :j"), {"j": job_id}).scalar_one()
               for job_id in tokens}
    for driver in (True, False):
        with one_statement(pg_env.app.state.engine) as conn:
            def page(job_id: int, now: datetime, driver: bool = driver) -> list[int]:
                principal = Principal(token_id=ids[job_id], role=Role.JOB, job_id=job_id)
                with monkeypatch.context() as patched:
                    if not driver:
                        patched.setattr(store_jobs, "driver_reads", lambda _conn: False)
                    rows, _ = list_job_rows(conn, principal, JobFilter(), live=live_values(principal, now, grace_s))
                return [r.id for r in rows]

            compiled = DriverSelect.for_dialect.cache_info()
            assert page(running, utcnow()) == [running]
            read = DriverSelect.for_dialect.cache_info()
            assert (read.hits + read.misses > compiled.hits + compiled.misses) == driver
            within_grace = finished_at + timedelta(seconds=grace_s / 2)
            assert page(finished, within_grace.astimezone(UTC).replace(tzinfo=None)) == [finished]  # naive: UTC
            with pytest.raises(Unproven):
                page(finished, finished_at + timedelta(seconds=grace_s * 2))


def test_a_value_of_the_wrong_kind_or_a_missing_one_is_refused_before_the_database(
        pg_env: Env, seeded: list[int]) -> None:
    admin = Principal(token_id="admin", role=Role.ADMIN)
    [statement] = _page_statements(store_jobs._SUMMARY_COLUMNS, Role.MEMBER, frozenset({"status"}),
                                   JobSort.parse("-submitted"), After.START)
    with one_statement(pg_env.app.state.engine) as conn:
        read = DriverSelect.for_dialect(statement, conn.dialect)
        assert read is not None
        with pytest.raises(StatementError, match="NOPE"):  # the Enum type's own check, as execute makes it
            read.rows(conn, {"status": ["NOPE"], "visible_team": 1, "visible_job": None, "limit": 5})
        with pytest.raises(StatementError, match="visible_team"):  # never another request's value
            read.rows(conn, {"status": [JobStatus.RUNNING], "limit": 5})
        assert list_job_rows(conn, admin, JobFilter(status=[JobStatus.RUNNING]))[0]


def test_each_number_of_statuses_reads_its_own_rows_from_one_statement(pg_env: Env, seeded: list[int]) -> None:
    """One compiled statement, its `IN` list rendered for each read's values: going back and forth
    between one, three, two and one status, each read has its own values' rows."""
    [statement] = _page_statements(store_jobs._SUMMARY_COLUMNS, Role.MEMBER, frozenset({"status"}),
                                   JobSort.parse("-submitted"), After.START)
    with one_statement(pg_env.app.state.engine) as conn:
        team_id = conn.execute(text("SELECT id FROM teams WHERE name = 'nlp'")).scalar_one()
        read = DriverSelect.for_dialect(statement, conn.dialect)
        assert read is not None
        for statuses in ([JobStatus.RUNNING], [JobStatus.QUEUED, JobStatus.FAILED, "SUCCEEDED"],
                         [JobStatus.FAILED, JobStatus.RUNNING], [JobStatus.QUEUED]):
            values = {"status": statuses, "visible_team": team_id, "visible_job": None, "limit": 50}
            rows = read.rows(conn, values)
            assert rows and {r.status for r in rows} <= set(statuses), statuses
            assert rows == conn.execute(statement, values).all(), statuses


def test_a_driver_error_comes_as_sqlalchemys_and_leaves_the_connection_usable(
        pg_env: Env, seeded: list[int]) -> None:
    [statement] = _page_statements(store_jobs._SUMMARY_COLUMNS, Role.ADMIN, frozenset(),
                                   JobSort.parse("-submitted"), After.START)
    with one_statement(pg_env.app.state.engine) as conn:
        read = DriverSelect.for_dialect(statement, conn.dialect)
        assert read is not None
        with pytest.raises(DBAPIError, match="LIMIT must not be negative") as refused:
            read.rows(conn, {"limit": -1})
        assert not refused.value.connection_invalidated and not conn.invalidated
        assert len(read.rows(conn, {"limit": 3})) == 3


def test_a_connection_lost_in_use_is_invalidated_and_the_next_read_gets_a_live_one(pg_env: Env,
                                                                                   seeded: list[int]) -> None:
    """As through `execute`: a read on a connection the database ended while it was checked out fails
    with `connection_invalidated`; the next read gets a live connection, not the pool's other dead one
    (an idle connection the server ended is replaced when it is taken, `db.closed_by_server`)."""
    engine = make_engine(pg_env.url)  # a pool of its own
    [statement] = _page_statements(store_jobs._SUMMARY_COLUMNS, Role.ADMIN, frozenset(),
                                   JobSort.parse("-submitted"), After.START)
    try:
        with engine.connect() as spare:  # back in the pool, idle, when its server process ends
            pids = {spare.execute(text("SELECT pg_backend_pid()")).scalar_one()}
        with one_statement(engine) as conn:
            read = DriverSelect.for_dialect(statement, conn.dialect)
            assert read is not None and driver_reads(conn)
            pids.add(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())
            with pg_env.app.state.engine.connect() as other:
                for pid in pids:
                    other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
                other.commit()
                deadline = time.monotonic() + 30
                while other.execute(text("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(:pids)"),
                                    {"pids": list(pids)}).scalar_one():
                    assert time.monotonic() < deadline, "the terminated server processes did not end"
                    time.sleep(0.05)
            with pytest.raises(DBAPIError) as lost:
                read.rows(conn, {"limit": 3})
            assert lost.value.connection_invalidated and conn.invalidated
        for _ in range(2):
            with one_statement(engine) as conn:
                assert len(read.rows(conn, {"limit": 3})) == 3
                assert conn.execute(text("SELECT pg_backend_pid()")).scalar_one() not in pids
    finally:
        engine.dispose()


def test_a_session_in_another_time_zone_is_read_through_execute(pg_env: Env, seeded: list[int]) -> None:
    """psycopg reads times in the session's zone, which `UtcDateTime`'s result processing would
    convert: the driver reads only where that zone is UTC (`make_engine`'s), so a page's times are
    UTC on any engine."""
    url = make_url(pg_env.url).update_query_dict({"options": "-c TimeZone=Asia/Kolkata"})
    engine = create_engine(url)  # not make_engine: its sessions stay in Asia/Kolkata
    try:
        with one_statement(engine) as conn:
            assert not driver_reads(conn)
            rows, _ = list_job_rows(conn, Principal(token_id="admin", role=Role.ADMIN), JobFilter(), limit=5)
        assert rows and all(r.created_at.tzinfo is UTC for r in rows)
        assert b'"created_at":"2026-12-01T09:3' in encoded(job_page(rows, None))
    finally:
        engine.dispose()


def test_a_statement_whose_parameters_sqlalchemy_would_rewrite_is_left_to_execute(pg_env: Env) -> None:
    """A parameter name the driver's format does not take, or a value rendered into the SQL
    (`literal_execute`): `for_dialect` gives None, and `_page` runs such a statement with `execute`."""
    dialect = pg_env.app.state.engine.dialect
    assert DriverSelect.for_dialect(select(Job.id).where(Job.name == bindparam("job name")), dialect) is None
    assert DriverSelect.for_dialect(select(Job.id).limit(bindparam("n", literal_execute=True)), dialect) is None
    assert DriverSelect.for_dialect(select(Job.id).where(Job.name == bindparam("job_name")), dialect) is not None


def test_listeners_for_the_cursor_see_every_statement_through_execute(pg_env: Env, seeded: list[int]) -> None:
    """A statement log or instrumentation on the engine turns the driver's reads off, so that it
    misses none: the list's page is then one statement it sees."""
    engine = pg_env.app.state.engine
    seen: list[str] = []

    def record(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        seen.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    try:
        with one_statement(engine) as conn:
            assert not driver_reads(conn)
            rows, _ = list_job_rows(conn, Principal(token_id="admin", role=Role.ADMIN), JobFilter(), limit=3)
    finally:
        event.remove(engine, "before_cursor_execute", record)
    assert len(rows) == 3 and len(seen) == 1 and "FROM jobs" in seen[0]
    with one_statement(engine) as conn:
        assert driver_reads(conn)
