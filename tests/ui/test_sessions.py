"""Dashboard sessions on the server (`service.store.ui_sessions`), without a browser: signing out ends
the session for every copy of its cookie and CSRF token; revoking or expiring the token, and the idle
and absolute lifetimes, end it too; a cookie holding an API token (as older versions set) is refused.
Each test runs on SQLite and on PostgreSQL (the `env` fixture)."""

from __future__ import annotations

import re
from datetime import timedelta
from types import SimpleNamespace

import httpx
from sqlalchemy import create_engine, inspect, select, update

from service.api.ui.session import COOKIE, UiSession, stream_auth
from service.store import migrate
from service.store.models import ApiToken, UiSessionRow, utcnow
from service.store.ui_sessions import session_hash, session_principal
from tests.db_fixtures import Env
from tests.specs import tiny


def _copy(env: Env) -> str:
    cookie = env.client.cookies.get(COOKIE)
    assert isinstance(cookie, str) and cookie
    return cookie


def _sent_with(cookie: str) -> dict[str, str]:
    """Headers that send `cookie` as the session cookie, and no other cookie (they replace the client's)."""
    return {"Cookie": f"{COOKIE}={cookie}"}


def _sent_to_sign_in(response: httpx.Response, next_path: str) -> bool:
    location = response.headers.get("location", "")
    return response.status_code == 303 and location.startswith("/ui/login") and next_path in location


def _login_nonce(env: Env) -> str:
    """The sign-in form's own token (its cookie stays in the client)."""
    nonce = re.search(r'name="csrf" value="([^"]+)"', env.client.get("/ui/login").text)
    assert nonce is not None
    return nonce.group(1)


def _rows(env: Env) -> list[UiSessionRow]:
    with env.app.state.sessions.begin() as session:
        return list(session.scalars(select(UiSessionRow)))


def test_sign_out_ends_the_session_for_a_copied_cookie_and_its_csrf_token(env: Env) -> None:
    admin = env.token("admin")
    job_id = env.client.post("/v1/jobs", json=tiny(name="kept"), headers=env.headers(admin)).json()["id"]
    csrf = env.sign_in_ui(admin)
    cookie = _copy(env)
    assert cookie != admin and admin not in cookie  # the cookie names the session, not the token
    page = env.client.get("/ui/jobs", headers=_sent_with(cookie))
    assert page.status_code == 200 and csrf in page.text  # the copy works while the session lives

    out = env.client.post("/ui/logout", data={"csrf": csrf}, follow_redirects=False)
    assert out.status_code == 303 and out.headers["location"] == "/ui/login"
    assert COOKIE not in env.client.cookies  # this browser's cookie is cleared...
    assert _rows(env) == []  # ...and the session itself is gone

    # Whoever copied the cookie and the page's CSRF token before sign-out:
    assert _sent_to_sign_in(env.client.get("/ui/jobs", headers=_sent_with(cookie), follow_redirects=False),
                            "/ui/jobs")
    refused = env.client.post(f"/ui/jobs/{job_id}/cancel", data={"csrf": csrf}, headers=_sent_with(cookie),
                              follow_redirects=False)
    assert _sent_to_sign_in(refused, f"/ui/jobs/{job_id}/cancel")
    htmx = env.client.post(f"/ui/jobs/{job_id}/cancel", follow_redirects=False,
                           headers={**_sent_with(cookie), "X-CSRF-Token": csrf, "HX-Request": "true"})
    assert htmx.status_code == 401 and htmx.headers["hx-redirect"].startswith("/ui/login")
    assert env.client.get(f"/v1/jobs/{job_id}", headers=env.headers(admin)).json()["status"] == "QUEUED"
    assert env.client.get("/v1/jobs", headers=env.headers(admin)).status_code == 200  # the token still works


def test_a_cookie_holding_an_api_token_is_not_a_session(env: Env) -> None:
    admin = env.token("admin")
    old = _sent_with(admin)  # what the dashboard set before it had sessions
    assert _sent_to_sign_in(env.client.get("/ui/jobs", headers=old, follow_redirects=False), "/ui/jobs")
    refused = env.client.post("/ui/plan", data={"spec": "name: x"}, headers=old, follow_redirects=False)
    assert _sent_to_sign_in(refused, "/ui/plan")
    form = env.client.get("/ui/login", headers=old)
    assert form.status_code == 200 and "API token" in form.text
    cleared = [c for c in form.headers.get_list("set-cookie") if c.startswith(f"{COOKIE}=")]
    assert len(cleared) == 1 and "Max-Age=0" in cleared[0]  # the sign-in page takes the token out of the browser


def test_revoking_the_token_ends_its_sessions(env: Env) -> None:
    admin, member = env.token("admin"), env.token("member", team="vision")
    env.sign_in_ui(member)
    cookie = _copy(env)
    env.sign_in_ui(member)  # a second session of the same token (another browser)
    other = _copy(env)
    assert cookie != other and len(_rows(env)) == 2
    token_id = member.split("_")[1]
    assert env.client.post(f"/v1/tokens/{token_id}/revoke", headers=env.headers(admin)).status_code == 200
    assert _rows(env) == []
    for each in (cookie, other):
        assert _sent_to_sign_in(env.client.get("/ui/queue", headers=_sent_with(each), follow_redirects=False),
                                "/ui/queue")


def test_an_expired_token_ends_its_sessions_at_once(env: Env) -> None:
    member = env.token("member", team="vision")
    env.sign_in_ui(member)
    with env.app.state.sessions.begin() as session:
        session.execute(update(ApiToken).where(ApiToken.id == member.split("_")[1])
                        .values(expires_at=utcnow() - timedelta(seconds=1)))
    assert _sent_to_sign_in(env.client.get("/ui/jobs", follow_redirects=False), "/ui/jobs")


def test_a_session_ends_when_idle_or_old_and_requests_keep_it_alive(env: Env) -> None:
    settings = env.app.state.settings
    admin = env.token("admin")
    job_id = env.client.post("/v1/jobs", json=tiny(name="waits"), headers=env.headers(admin)).json()["id"]
    env.sign_in_ui(admin)
    cookie = _copy(env)
    id_hash = session_hash(cookie)

    def move(**values: object) -> None:
        with env.app.state.sessions.begin() as session:
            session.execute(update(UiSessionRow).where(UiSessionRow.id_hash == id_hash).values(**values))

    def seen_ago() -> timedelta:
        with env.app.state.sessions.begin() as session:
            seen = session.scalar(select(UiSessionRow.last_seen_at).where(UiSessionRow.id_hash == id_hash))
        assert seen is not None
        return utcnow() - seen

    # A person's request moves last_seen_at forward (at most once a minute); what the page fetches by
    # itself (the "why pending" refresh, live streams) does not.
    move(last_seen_at=utcnow() - timedelta(seconds=settings.ui_session_idle_s - 30))
    assert env.client.get(f"/ui/jobs/{job_id}/pending", headers={"HX-Request": "true"}).status_code == 200
    with env.app.state.sessions.begin() as session:
        assert session_principal(session, cookie, idle_s=settings.ui_session_idle_s, touch=False) is not None
    assert seen_ago() > timedelta(seconds=60)
    assert env.client.get("/ui/jobs").status_code == 200
    assert seen_ago() < timedelta(seconds=60)

    move(last_seen_at=utcnow() - timedelta(seconds=settings.ui_session_idle_s + 1))
    assert _sent_to_sign_in(env.client.get("/ui/jobs", follow_redirects=False), "/ui/jobs")
    move(last_seen_at=utcnow(), expires_at=utcnow() - timedelta(seconds=1))  # active, but past its lifetime
    assert _sent_to_sign_in(env.client.get("/ui/jobs", follow_redirects=False), "/ui/jobs")

    env.sign_in_ui(admin)  # signing in deletes the sessions that have ended
    assert [row.id_hash for row in _rows(env)] == [session_hash(_copy(env))]


def test_each_session_has_its_own_csrf_token_and_signing_in_again_ends_the_previous_one(env: Env) -> None:
    admin = env.token("admin")
    job_id = env.client.post("/v1/jobs", json=tiny(name="kept"), headers=env.headers(admin)).json()["id"]
    first_csrf = env.sign_in_ui(admin)
    first = _copy(env)
    second_csrf = env.sign_in_ui(admin)
    assert second_csrf != first_csrf and len(_rows(env)) == 2
    forged = env.client.post(f"/ui/jobs/{job_id}/cancel", data={"csrf": first_csrf}, follow_redirects=False)
    assert forged.status_code == 403 and "CSRF" in forged.text
    # A form loaded before `first` signed in, sent from the browser that holds `first`: `first` ends.
    env.client.cookies.clear()
    nonce = _login_nonce(env)
    login = env.client.cookies.get("shardctl_login")
    again = env.client.post("/ui/login", data={"token": admin, "csrf": nonce}, follow_redirects=False,
                            headers={"Cookie": f"{COOKIE}={first}; shardctl_login={login}"})
    assert again.status_code == 303
    assert session_hash(first) not in {row.id_hash for row in _rows(env)} and len(_rows(env)) == 2


def test_a_live_streams_check_ends_with_the_session(env: Env) -> None:
    admin = env.token("admin")
    csrf = env.sign_in_ui(admin)
    cookie = _copy(env)
    sessions = env.app.state.sessions
    with sessions.begin() as tx:
        principal = session_principal(tx, cookie, idle_s=env.app.state.settings.ui_session_idle_s)
    assert principal is not None and principal.token_id == admin.split("_")[1]
    check = stream_auth(SimpleNamespace(app=env.app), UiSession(principal, csrf, cookie))  # type: ignore[arg-type]
    with sessions.begin() as tx:
        assert check(tx) == principal
    env.client.post("/ui/logout", data={"csrf": csrf}, follow_redirects=False)
    with sessions.begin() as tx:
        assert check(tx) is None  # the stream's next poll sends `signed-out`


def test_a_job_token_cannot_sign_in(env: Env) -> None:
    admin = env.token("admin")
    job_id = env.client.post("/v1/jobs", json=tiny(name="j"), headers=env.headers(admin)).json()["id"]
    job_token = env.token("job", job_id=job_id)
    answer = env.client.post("/ui/login", data={"token": job_token, "csrf": _login_nonce(env)},
                             follow_redirects=False)
    assert answer.status_code == 401 and _rows(env) == []


def test_the_sessions_migration_goes_down_to_0010_and_up_again_without_drift(db_url: str) -> None:
    head = migrate.current_revision(db_url)
    assert migrate.drift(db_url) == []
    migrate.downgrade(db_url, "0010")
    engine = create_engine(db_url)
    try:
        assert "ui_sessions" not in inspect(engine).get_table_names()
        migrate.upgrade(db_url)
        assert "ui_sessions" in inspect(engine).get_table_names()
    finally:
        engine.dispose()
    assert migrate.current_revision(db_url) == head and migrate.drift(db_url) == []
