"""Dashboard sessions: the sign-in cookie, CSRF tokens, and the dependencies every page uses.

Contract:

- Signing in (`/ui/login`) checks an API token with the API's own `authenticate`
  (`service.store.tokens`) and starts a session of its own (`service.store.ui_sessions`): a row keyed
  by the SHA-256 of a random 256-bit id, linked to the token. The browser gets one cookie,
  `shardctl_session`, holding that id (never the token): HttpOnly (page scripts cannot read it),
  SameSite=Lax (other sites' forms cannot send it), Secure when the page came over HTTPS, scoped to
  `/ui`. Job tokens cannot sign in (they only report on their job).
- Every request looks the session up again, in one statement that also checks its token
  (`session_principal`): signing out (which deletes the row), the idle and absolute lifetimes
  (`SHARDCTL_UI_SESSION_IDLE_S`, `..._MAX_S`), and the token's revocation or expiry end it at once,
  for every copy of the cookie. What a page fetches by itself (`Polled`, live streams' polls) checks
  it without keeping it alive.
- A page sees exactly what the token sees in the API: `UiSession.principal` is a
  `service.store.tokens.Principal`, handed to the store's functions (`visible_job`, `list_jobs`...).
- Every state-changing request is a POST carrying the session's CSRF token, in the form field
  `csrf` or the `X-CSRF-Token` header (htmx sends the header: see `base.html`). The token is an
  HMAC of a fixed label keyed by the session's id: only someone who can read our pages (same
  origin) learns it, each session has its own, and it stops working when its session ends. A POST
  without it is a 403.

Use `Signed` (any signed-in person) or `SignedAdmin` (admins; members get a 403 page) as a
route's parameter type, `Polled` for what a page fetches by itself (a live stream, a timed refresh:
it does not keep the session alive), and `Csrf` as the parameter of every POST route.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Form, Header, Request
from sqlalchemy.orm import Session, sessionmaker
from starlette.responses import Response

from service.api.deps import Db
from service.api.stream_auth import StreamAuth
from service.api.ui.errors import SignInRequired, UiError
from service.settings import Settings
from service.store.tokens import Principal, authenticate
from service.store.ui_sessions import create_session, end_session, session_principal
from service.store.vocab import Role

COOKIE = "shardctl_session"
COOKIE_PATH = "/ui"
CSRF_FIELD = "csrf"
CSRF_HEADER = "X-CSRF-Token"
_CSRF_LABEL = b"shardctl-ui-csrf-v1"


@dataclass(frozen=True, slots=True)
class UiSession:
    """A signed-in person: their principal (as the API sees their token), the CSRF token of their
    session, and the session's id (the cookie's value, for signing out and for live streams)."""

    principal: Principal
    csrf: str
    session_id: str = field(repr=False)

    @property
    def is_admin(self) -> bool:
        return self.principal.role == Role.ADMIN

    @property
    def who(self) -> str:
        """How the header names the person: the team for a member, 'admin' for an admin."""
        if self.principal.role == Role.ADMIN:
            return "admin"
        return f"team {self.principal.team_name}"


def csrf_for(session_id: str) -> str:
    """The CSRF token of the session `session_id`."""
    return hmac.new(session_id.encode(), _CSRF_LABEL, hashlib.sha256).hexdigest()


def sign_in(db: sessionmaker[Session], settings: Settings, secret: str, previous: str | None) -> str | None:
    """Start a session for the API token `secret` and return its id (for the cookie); None when the
    token is unknown, revoked or expired, or a job's token (which may not sign in). `previous`, the
    session id the browser sent, if any, is ended: one browser, one session. One transaction."""
    with db.begin() as session:
        principal = authenticate(session, secret, job_token_grace_s=settings.job_token_grace_s)
        if principal is None or principal.role == Role.JOB:
            return None
        if previous:
            end_session(session, previous)
        return create_session(session, principal.token_id, idle_s=settings.ui_session_idle_s,
                              max_s=settings.ui_session_max_s)


def sign_out(db: sessionmaker[Session], session_id: str) -> None:
    """End the session `session_id`: its cookie and CSRF token stop working, wherever copies of them are."""
    with db.begin() as session:
        end_session(session, session_id)


def current_session(request: Request, db: Db, *, touch: bool = True) -> UiSession | None:
    """The session of this request's cookie, or None when there is none or it has ended. With `touch`
    (a person's request) a live session is kept alive: its idle lifetime starts again."""
    session_id = request.cookies.get(COOKIE)
    if not session_id:
        return None
    with db.begin() as session:
        principal = session_principal(session, session_id, idle_s=request.app.state.settings.ui_session_idle_s,
                                      touch=touch)
    if principal is None:
        return None
    return UiSession(principal=principal, csrf=csrf_for(session_id), session_id=session_id)


def stream_auth(request: Request, session: UiSession) -> StreamAuth:
    """How a live stream of `session` checks it on every poll: the session again (ended: the stream
    ends), without keeping it alive, since an open page is not the person acting."""
    idle_s: float = request.app.state.settings.ui_session_idle_s
    session_id = session.session_id

    def check(tx: Session) -> Principal | None:
        return session_principal(tx, session_id, idle_s=idle_s, touch=False)

    return check


def require_session(request: Request, db: Db) -> UiSession:
    """The signed-in session, else `SignInRequired` (a redirect to the sign-in page, back here after)."""
    found = current_session(request, db)
    if found is None:
        raise SignInRequired(request.url.path + (f"?{request.url.query}" if request.url.query else ""))
    return found


Signed = Annotated[UiSession, Depends(require_session)]


def require_polled_session(request: Request, db: Db) -> UiSession:
    """`require_session` for what an open page fetches by itself (live streams, timed refreshes): it
    does not keep the session alive, so a page left open still signs out when idle."""
    found = current_session(request, db, touch=False)
    if found is None:
        raise SignInRequired(request.url.path + (f"?{request.url.query}" if request.url.query else ""))
    return found


Polled = Annotated[UiSession, Depends(require_polled_session)]


def require_ui_admin(session: Signed) -> UiSession:
    if not session.is_admin:
        raise UiError(403, "Admins only", "This page needs an admin token. Sign in with one to open it.")
    return session


SignedAdmin = Annotated[UiSession, Depends(require_ui_admin)]


def check_csrf(session: Signed,
               csrf: Annotated[str | None, Form(alias=CSRF_FIELD)] = None,
               x_csrf_token: Annotated[str | None, Header(alias=CSRF_HEADER)] = None) -> UiSession:
    """The session, if the POST carries its CSRF token (form field or header); else a 403."""
    sent = csrf or x_csrf_token or ""
    if not hmac.compare_digest(sent.encode(), session.csrf.encode()):
        raise UiError(403, "Form expired", f"This request did not carry the page's CSRF token (form field"
                      f" '{CSRF_FIELD}' or header '{CSRF_HEADER}'). Reload the page and try again.")
    return session


Csrf = Annotated[UiSession, Depends(check_csrf)]


def _secure(request: Request) -> bool:
    """HTTPS as the browser sees it: this request's scheme, or the public URL's (behind a TLS-terminating
    ingress the server itself is reached over plain HTTP, and serve trusts no forwarded scheme)."""
    return request.url.scheme == "https" or str(request.app.state.settings.public_url).startswith("https://")


def set_session_cookie(response: Response, request: Request, session_id: str) -> None:
    response.set_cookie(COOKIE, session_id, path=COOKIE_PATH, httponly=True, samesite="lax", secure=_secure(request))


def clear_session_cookie(response: Response, request: Request) -> None:
    response.delete_cookie(COOKIE, path=COOKIE_PATH, httponly=True, samesite="lax", secure=_secure(request))
