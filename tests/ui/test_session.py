"""Sign-in, sign-out and CSRF in a real browser: the session is an HttpOnly cookie naming a session on
the server (never the API token), which sign-out ends; every POST needs the page's CSRF token; pages
are accessible (axe-core). `test_sessions.py` covers sessions' rules without a browser."""

from __future__ import annotations

from typing import Any

import httpx

from tests.ui.conftest import Dashboard, run_axe, screenshots, sign_in


def test_sign_in_sets_an_httponly_samesite_cookie_and_sign_out_ends_the_session(dashboard: Dashboard,
                                                                                 page: Any) -> None:
    token = dashboard.token("member", team="vision")
    page.goto(f"{dashboard.url}/ui/login")
    assert run_axe(page) == []
    screenshots(page, "login")
    sign_in(page, dashboard.url, token)
    cookie = next(c for c in page.context.cookies() if c["name"] == "shardctl_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Lax" and cookie["path"] == "/ui"
    assert token not in cookie["value"]  # the cookie names a session; the token stays out of the browser
    assert page.evaluate("document.cookie").find("shardctl_session") == -1  # scripts cannot read it
    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url("**/ui/login")
    assert not [c for c in page.context.cookies() if c["name"] == "shardctl_session"]
    page.goto(f"{dashboard.url}/ui/jobs")
    assert "/ui/login" in page.url  # signed out: the pages need signing in again
    copied = httpx.get(f"{dashboard.url}/ui/jobs", cookies={"shardctl_session": cookie["value"]},
                       follow_redirects=False)
    assert copied.status_code == 303 and copied.headers["location"].startswith("/ui/login")  # ended on the server


def test_a_wrong_token_is_refused_with_the_field_named(dashboard: Dashboard, page: Any) -> None:
    page.goto(f"{dashboard.url}/ui/login")
    page.get_by_label("API token").fill("shc_0000000000000000_nope")
    page.get_by_role("button", name="Sign in").click()
    alert = page.get_by_role("alert")
    assert "Token: unknown, revoked or expired" in alert.inner_text()
    assert "/ui/login" in page.url


def test_a_post_without_the_csrf_token_is_refused(dashboard: Dashboard, page: Any) -> None:
    token = dashboard.token("member", team="vision")
    sign_in(page, dashboard.url, token)
    cookies = {c["name"]: c["value"] for c in page.context.cookies()}
    # The browser's own session, without the page's token: refused, and the session stays.
    answer = page.request.post(f"{dashboard.url}/ui/logout", form={}, max_redirects=0)
    assert answer.status == 403 and "CSRF" in answer.text()
    forged = httpx.post(f"{dashboard.url}/ui/logout", cookies=cookies, data={"csrf": "0" * 64},
                        follow_redirects=False)
    assert forged.status_code == 403
    page.goto(f"{dashboard.url}/ui/jobs")
    assert page.url.endswith("/ui/jobs")  # still signed in
