"""`GET /v1/jobs/{id}/explain` answers a waiting job from the dispatcher's queue view:
after a dispatcher cycle the answer carries `as_of` and says what the live computation says; a
change to a quota drops the view (answers are live again, `as_of` null, until the next cycle); a job
the view does not hold yet is answered live; a view older than `queue_view_max_age_s` is not used."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import select

from service.store.models import Job, utcnow
from service.store.queue_view import view_age_s
from tests.db_fixtures import Env
from tests.support.quotas import program, setup, submit
from workers.backends.local import LocalBackend
from workers.dispatch.context import DispatcherConfig
from workers.dispatcher import Dispatcher


def explain(env: Env, headers: dict[str, str], job_id: int) -> dict[str, Any]:
    r = env.client.get(f"/v1/jobs/{job_id}/explain", headers=headers)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def _same_but_time(a: dict[str, Any], b: dict[str, Any]) -> None:
    """Equal but for when it was computed: `as_of`, and the ETA band counted from a later now."""
    strip = {"as_of", "eta"}
    assert {k: v for k, v in a.items() if k not in strip} == {k: v for k, v in b.items() if k not in strip}
    assert a["eta"]["method"].startswith(b["eta"]["method"])


def test_explain_reads_the_view_and_falls_back_when_it_is_stale_or_dropped(env: Env, admin: dict[str, str],
                                                                          tmp_path: Path) -> None:
    members = setup(env, admin, 2, {"alpha": {"flavors": {"cpu": {"nominal": 1, "borrowing_limit": 0}}}})
    gate = tmp_path / "gate"
    code = f"import os, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.1)"
    submit(env, members["alpha"], program(code, team="alpha", name="first"))  # holds alpha's one GPU
    waiting = [submit(env, members[t], program("pass", team=t, name=f"w-{t}-{i}"))
               for i, t in enumerate(["alpha", "beta", "alpha", "gamma", "alpha"])]
    d = Dispatcher(env.app.state.sessions, {"local": LocalBackend(tmp_path / "local")}, DispatcherConfig())
    try:
        d.run_once()  # admits `first` and one more; the view is written at the end of the cycle
        settings = env.app.state.settings
        with env.app.state.sessions() as session:
            assert view_age_s(session, utcnow()) is not None
        with env.app.state.sessions() as session:  # waiting for admission: QUEUED without a pool
            queued = [j.id for j in session.scalars(select(Job).where(Job.id.in_(waiting), Job.status == "QUEUED",
                                                                      Job.pool.is_(None)).order_by(Job.id))]
        assert len(queued) >= 3
        for job in queued:
            team = env.client.get(f"/v1/jobs/{job}", headers=admin).json()["team"]
            for who in (members[team], admin):
                viewed = explain(env, who, job)
                assert viewed["as_of"] is not None and "queue view" in viewed["eta"]["method"], viewed
                settings.queue_view_max_age_s = 0.0  # the same question, computed live
                try:
                    live = explain(env, who, job)
                finally:
                    settings.queue_view_max_age_s = 60.0
                assert live["as_of"] is None
                _same_but_time(viewed, live)
        last = queued[-1]
        last_team = env.client.get(f"/v1/jobs/{last}", headers=admin).json()["team"]
        mine = explain(env, members[last_team], last)
        everyone = explain(env, admin, last)
        assert mine["as_of"] is not None and everyone["ahead"]
        assert all(a["team"] == last_team for a in mine["ahead"])  # a member's answer names its own team only
        others = {a["job_id"] for a in everyone["ahead"] if a["team"] != last_team}
        assert others and not others & {a["job_id"] for a in mine["ahead"]}
        assert mine["ahead_other_teams"]["jobs"] == len(others)

        # a job whose state changed after the view (as a requeue's transition stamps it) is answered live
        with env.app.state.sessions.begin() as session:
            session.get(Job, last).updated_at = utcnow()
        assert explain(env, members[last_team], last)["as_of"] is None

        # a quota change drops the view: live answers (which see the new quota) until the next cycle
        r = env.client.put("/v1/teams/alpha/quota", json={"flavors": {"cpu": {"nominal": 0, "borrowing_limit": 0}}},
                           headers=admin)
        assert r.status_code == 200, r.text
        alpha_waiting = next(j for j in queued if env.client.get(f"/v1/jobs/{j}", headers=admin).json()["team"]
                             == "alpha")
        dropped = explain(env, members["alpha"], alpha_waiting)
        assert dropped["as_of"] is None
        assert {r["code"] for r in dropped["reasons"]} & {"exceeds_team_limit", "quota_exceeded"}, dropped
        assert d.queue_view.refresh()  # the next cycle's refresh, whenever the time budget allows it
        assert explain(env, members["alpha"], alpha_waiting)["as_of"] is not None

        # a job submitted after the last refresh is not in the view: answered live
        late = submit(env, members["beta"], program("pass", team="beta", name="late"))
        if env.client.get(f"/v1/jobs/{late}", headers=admin).json()["status"] == "QUEUED":
            assert explain(env, members["beta"], late)["as_of"] is None
    finally:
        gate.write_text("go")
