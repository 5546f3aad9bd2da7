from __future__ import annotations

from fastapi import APIRouter
from sqlalchemy import select

from service.api.deps import Admin, Db, Person
from service.api.schemas import ErrorResponse, TeamIn, TeamOut
from service.api.views import team_out
from service.store.models import Team
from service.store.tokens import create_team
from service.store.visibility import team_scope

router = APIRouter(prefix="/v1/teams", tags=["teams"])


@router.get("", response_model=list[TeamOut], summary="Teams (a member sees their own)")
def list_teams(principal: Person, db: Db) -> list[TeamOut]:
    with db.begin() as session:
        stmt = select(Team).order_by(Team.name)
        scope = team_scope(principal, Team.id)
        if scope is not None:
            stmt = stmt.where(scope)
        return [team_out(t) for t in session.scalars(stmt)]


@router.post("", response_model=TeamOut, status_code=201, responses={409: {"model": ErrorResponse}})
def post_team(body: TeamIn, _: Admin, db: Db) -> TeamOut:
    with db.begin() as session:
        return team_out(create_team(session, body.name))
