"""Sign-in and sign-out (`/ui/login`, `/ui/logout`).

The sign-in form takes an API token (`shardctl token create`; field `token`) and starts a session
(`service.api.ui.session.sign_in`); signing out ends it on the server, not only in this browser.
Before a session exists, the form is protected by a double-submit token: `GET /ui/login` sets a
random value in a cookie scoped to the form and puts the same value in the form; the POST must
carry both.
"""

from __future__ import annotations

import hmac
import secrets
from typing import Annotated

from fastapi import APIRouter, Form, Request
from starlette.responses import RedirectResponse, Response

from service.api.deps import Db
from service.api.ui.errors import LOGIN_PATH
from service.api.ui.render import page
from service.api.ui.session import (
    COOKIE,
    CSRF_FIELD,
    Csrf,
    clear_session_cookie,
    current_session,
    set_session_cookie,
    sign_in,
    sign_out,
)

router = APIRouter(tags=["ui"], include_in_schema=False)
LOGIN_COOKIE = "shardctl_login"
HOME = "/ui/jobs"


def _safe_next(target: str | None) -> str:
    """Only paths of this dashboard: never another site (an open redirect)."""
    if target and target.startswith("/ui/") and not target.startswith("//") and "\\" not in target:
        return target
    return HOME


def _form(request: Request, next_path: str, *, error: str | None = None, status_code: int = 200) -> Response:
    nonce = secrets.token_urlsafe(24)
    response = page(request, None, "login.html", title="Sign in", status_code=status_code, login_csrf=nonce,
                    next_path=next_path, error=error)
    response.set_cookie(LOGIN_COOKIE, nonce, path=LOGIN_PATH, httponly=True, samesite="strict",
                        secure=request.url.scheme == "https")
    return response


@router.get(LOGIN_PATH)
def login_form(request: Request, db: Db, next: str | None = None) -> Response:
    if current_session(request, db) is not None:
        return RedirectResponse(_safe_next(next), status_code=303)
    response = _form(request, _safe_next(next))
    if COOKIE in request.cookies:  # an ended session's id, or an API token an older version stored there
        clear_session_cookie(response, request)
    return response


@router.post(LOGIN_PATH)
def login(request: Request, db: Db, token: Annotated[str, Form(max_length=400)] = "",
          csrf: Annotated[str, Form(alias=CSRF_FIELD, max_length=100)] = "",
          next: Annotated[str, Form(max_length=2000)] = HOME) -> Response:
    target = _safe_next(next)
    expected = request.cookies.get(LOGIN_COOKIE, "")
    if not expected or not hmac.compare_digest(csrf.encode(), expected.encode()):
        return _form(request, target, status_code=403,
                     error="The sign-in form expired or came from another page. Enter your token again.")
    secret = token.strip()
    if not secret:
        return _form(request, target, status_code=422, error="Token: enter an API token (shc_...).")
    session_id = sign_in(db, request.app.state.settings, secret, request.cookies.get(COOKIE))
    if session_id is None:
        return _form(request, target, status_code=401,
                     error="Token: unknown, revoked or expired, or a job's token. Use an admin or team"
                           " member token (shardctl token create).")
    response = RedirectResponse(target, status_code=303)
    set_session_cookie(response, request, session_id)
    response.delete_cookie(LOGIN_COOKIE, path=LOGIN_PATH)
    return response


@router.post("/ui/logout")
def logout(request: Request, session: Csrf, db: Db) -> Response:
    """End the session on the server (every copy of its cookie stops working), then clear the cookie."""
    sign_out(db, session.session_id)
    response = RedirectResponse(LOGIN_PATH, status_code=303)
    clear_session_cookie(response, request)
    return response
