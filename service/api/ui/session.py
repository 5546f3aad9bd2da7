"""Dashboard sessions: the sign-in cookie, CSRF tokens, and the dependencies every page uses.

Contract:

- Signing in (`/ui/login`) checks an API token with the API's own `authenticate`
  (`service.store.tokens`) and sets one cookie, `shardctl_session`, holding that token: HttpOnly
  (page scripts cannot read it), SameSite=Lax (other sites' forms cannot send it), Secure when the
  page came over HTTPS, scoped to `/ui`. Every request authenticates the cookie's token again, so a
  revoked or expired token ends the session at once; there is no session table to keep in step.
  Signing out clears the cookie. Job tokens cannot sign in (they only report on their job).
- A page sees exactly what the token sees in the API: `UiSession.principal` is a
  `service.store.tokens.Principal`, handed to the store's functions (`visible_job`, `list_jobs`...).
- Every state-changing request is a POST carrying the session's CSRF token, in the form field
  `csrf` or the `X-CSRF-Token` header (htmx sends the header: see `base.html`). The token is an
  HMAC of a fixed label keyed by the session's secret: only someone who can read our pages (same
  origin) learns it, and it changes with the session. A POST without it is a 403.

Use `Signed` (any signed-in person) or `SignedAdmin` (admins; members get a 403 page) as a
route's parameter type, and `Csrf` as the parameter of every POST route.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Form, Header, Request
from sqlalchemy.orm import Session, sessionmaker
from starlette.responses import Response

from service.api.deps import Db
from service.api.ui.errors import SignInRequired, UiError
from service.store.tokens import Principal, authenticate
from service.store.vocab import Role

COOKIE = "shardctl_session"
COOKIE_PATH = "/ui"
CSRF_FIELD = "csrf"
CSRF_HEADER = "X-CSRF-Token"
_CSRF_LABEL = b"shardctl-ui-csrf-v1"


@dataclass(frozen=True, slots=True)
class UiSession:
    """A signed-in person: their principal (as the API sees the token) and the CSRF token of the session."""

    principal: Principal
    csrf: str

    @property
    def is_admin(self) -> bool:
        return self.principal.role == Role.ADMIN

    @property
    def who(self) -> str:
        """How the header names the person: the team for a member, 'admin' for an admin."""
        if self.principal.role == Role.ADMIN:
            return "admin"
        return f"team {self.principal.team_name}"


def csrf_for(secret: str) -> str:
    return hmac.new(secret.encode(), _CSRF_LABEL, hashlib.sha256).hexdigest()


def principal_for(db: sessionmaker[Session], secret: str, job_token_grace_s: float) -> Principal | None:
    """The principal of an API token, or None (unknown, revoked, expired, or a job token)."""
    with db.begin() as session:
        principal = authenticate(session, secret, job_token_grace_s=job_token_grace_s)
    if principal is None or principal.role == Role.JOB:
        return None
    return principal


def current_session(request: Request, db: Db) -> UiSession | None:
    """The session of this request's cookie, or None when there is none or its token no longer works."""
    secret = request.cookies.get(COOKIE)
    if not secret:
        return None
    principal = principal_for(db, secret, request.app.state.settings.job_token_grace_s)
    return UiSession(principal=principal, csrf=csrf_for(secret)) if principal is not None else None


def require_session(request: Request, db: Db) -> UiSession:
    """The signed-in session, else `SignInRequired` (a redirect to the sign-in page, back here after)."""
    found = current_session(request, db)
    if found is None:
        raise SignInRequired(request.url.path + (f"?{request.url.query}" if request.url.query else ""))
    return found


Signed = Annotated[UiSession, Depends(require_session)]


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


def set_session_cookie(response: Response, request: Request, secret: str) -> None:
    response.set_cookie(COOKIE, secret, path=COOKIE_PATH, httponly=True, samesite="lax", secure=_secure(request))


def clear_session_cookie(response: Response, request: Request) -> None:
    response.delete_cookie(COOKIE, path=COOKIE_PATH, httponly=True, samesite="lax", secure=_secure(request))
