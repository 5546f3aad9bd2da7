"""Typed dependencies: the database, the calling principal, and role checks."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session, sessionmaker

from service.api.errors import ApiError
from service.store.tokens import Principal, authenticate

bearer = HTTPBearer(auto_error=False, description="A shardctl token: shc_<id>_<secret>.")


def get_db(request: Request) -> sessionmaker[Session]:
    factory: sessionmaker[Session] = request.app.state.sessions
    return factory


Db = Annotated[sessionmaker[Session], Depends(get_db)]


def get_principal(db: Db, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> Principal:
    unauthorized = {"WWW-Authenticate": "Bearer"}
    if credentials is None:
        raise ApiError(401, "unauthorized", "missing bearer token: send 'Authorization: Bearer shc_...'",
                       headers=unauthorized)
    with db.begin() as session:
        principal = authenticate(session, credentials.credentials)
    if principal is None:
        raise ApiError(401, "unauthorized", "unknown, revoked or expired token", headers=unauthorized)
    return principal


Caller = Annotated[Principal, Depends(get_principal)]


def require_admin(principal: Caller) -> Principal:
    if principal.role != "admin":
        raise ApiError(403, "forbidden", "this needs an admin token")
    return principal


def require_person(principal: Caller) -> Principal:
    """Admins and team members; job tokens may only report on their job."""
    if principal.role == "job":
        raise ApiError(403, "forbidden", "a job token can only report on its own job")
    return principal


def require_reporter(principal: Caller) -> Principal:
    """A job's own token, or an admin: those who report measurements and profiles on a job."""
    if principal.role == "member":
        raise ApiError(403, "forbidden", "only the job's own token (or an admin) reports on a job")
    return principal


Admin = Annotated[Principal, Depends(require_admin)]
Person = Annotated[Principal, Depends(require_person)]
Reporter = Annotated[Principal, Depends(require_reporter)]
