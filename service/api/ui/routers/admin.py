"""The Admin page (`/ui/admin`): teams and their quotas (edit one), tokens (create, revoke). Admins
only: a member gets a 403 page and no link to it (`SignedAdmin`, `nav.NavEntry(admin=True)`).

Contract:

- Lists are keyset-paginated queries: teams by name (20 a page, filter by part of the name), tokens
  newest first (20 a page, filter by role and team; revoked ones hidden unless asked). Job tokens
  are not listed (as `GET /v1/tokens`).
- Editing a quota (`POST /ui/admin/quota`, CSRF) sets one GPU kind of a team's quota and its weight
  and highest priority, keeping the other kinds, through `PUT /v1/teams/{team}/quota`'s operation
  (`service.api.ops.teams.declare_quota`: the same checks, the kind must be some pool's). A team not
  yet known is created.
- Creating a token (`POST /ui/admin/tokens`, CSRF) goes through `POST /v1/tokens`' operation
  (`service.api.ops.tokens.issue_token`) and answers this page with the secret shown once (only
  its hash is stored; a reload does not show it again). Revoking (`POST /ui/admin/tokens/{id}/revoke`,
  CSRF, `ops.tokens.revoke`) refuses the last live admin token.
- A refused form is this page again (422/404/409) with the API's message naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Form, Path, Query, Request
from pydantic import ValidationError
from sqlalchemy import select, tuple_
from sqlalchemy.orm import Session
from starlette.responses import RedirectResponse, Response

from service.api.deps import Db
from service.api.errors import ApiError
from service.api.ops.teams import declare_quota
from service.api.ops.tokens import issue_token, revoke
from service.api.schemas import TokenCreated, TokenIn, TokenOut
from service.api.ui.render import page
from service.api.ui.session import Csrf, SignedAdmin, UiSession
from service.api.views import token_out
from service.names import check_label
from service.scheduling.model import FlavorQuota, TeamQuota
from service.spec import field_path
from service.store.models import ApiToken, Team, TeamQuotaRow
from service.store.pools import effective_pools
from service.store.tokens import Conflict, NotFound
from service.store.vocab import Role

router = APIRouter(tags=["ui"], include_in_schema=False)
PAGE_SIZE = 20
TEAM_ROLES = (Role.MEMBER, Role.ADMIN)


@dataclass(frozen=True, slots=True)
class TeamRow:
    name: str
    created_at: datetime
    quota: TeamQuota | None


@dataclass(frozen=True, slots=True)
class Refusal:
    """What the API refused and the fields it named."""

    title: str
    message: str
    fields: list[tuple[str, str]]


@dataclass(frozen=True, slots=True)
class AdminQuery:
    team_name: str = ""
    teams_after: str = ""
    role: str = ""
    token_team: str = ""
    revoked: bool = False
    tokens_after: str = ""  # "<created_at ISO>|<id>" of the last token shown

    def url(self, **changes: Any) -> str:
        values = {"team_name": self.team_name, "teams_after": self.teams_after, "role": self.role,
                  "token_team": self.token_team, "revoked": "1" if self.revoked else "",
                  "tokens_after": self.tokens_after, **changes}
        pairs = [(k, str(v)) for k, v in values.items() if v]
        return "/ui/admin" + (f"?{urlencode(pairs)}" if pairs else "")


def read_query(request: Request) -> AdminQuery:
    q = request.query_params
    role = q.get("role", "")
    return AdminQuery(team_name=q.get("team_name", "")[:63], teams_after=q.get("teams_after", "")[:63],
                      role=role if role in {r.value for r in TEAM_ROLES} else "",
                      token_team=q.get("token_team", "")[:63], revoked=q.get("revoked") == "1",
                      tokens_after=q.get("tokens_after", "")[:100])


def team_rows(session: Session, query: AdminQuery) -> tuple[list[TeamRow], str | None]:
    stmt = (select(Team.name, Team.created_at, TeamQuotaRow.quota)
            .outerjoin(TeamQuotaRow, TeamQuotaRow.team_id == Team.id).order_by(Team.name).limit(PAGE_SIZE + 1))
    if query.team_name:
        stmt = stmt.where(Team.name.contains(query.team_name, autoescape=True))
    if query.teams_after:
        stmt = stmt.where(Team.name > query.teams_after)
    rows = [TeamRow(name, created, quota) for name, created, quota in session.execute(stmt)]
    return rows[:PAGE_SIZE], rows[PAGE_SIZE - 1].name if len(rows) > PAGE_SIZE else None


def token_rows(session: Session, query: AdminQuery) -> tuple[list[TokenOut], str | None]:
    stmt = (select(ApiToken).where(ApiToken.role.in_(TEAM_ROLES))
            .order_by(ApiToken.created_at.desc(), ApiToken.id.desc()).limit(PAGE_SIZE + 1))
    if query.role:
        stmt = stmt.where(ApiToken.role == Role(query.role))
    if query.token_team:
        stmt = stmt.join(Team, Team.id == ApiToken.team_id).where(Team.name == query.token_team)
    if not query.revoked:
        stmt = stmt.where(ApiToken.revoked_at.is_(None))
    if query.tokens_after:
        stamp, _, last_id = query.tokens_after.partition("|")
        try:
            after = datetime.fromisoformat(stamp)
        except ValueError:
            after = None
        if after is not None:
            stmt = stmt.where(tuple_(ApiToken.created_at, ApiToken.id) < tuple_(after, last_id))
    rows = list(session.scalars(stmt))
    more = len(rows) > PAGE_SIZE
    shown = [token_out(t) for t in rows[:PAGE_SIZE]]
    cursor = f"{shown[-1].created_at.isoformat()}|{shown[-1].id}" if more else None
    return shown, cursor


def render(request: Request, session: UiSession, db: Db, *, created: TokenCreated | None = None,
           refusal: Refusal | None = None, notice: str | None = None, status_code: int = 200,
           form: dict[str, str] | None = None) -> Response:
    query = read_query(request) if request.method == "GET" else AdminQuery()
    with db.begin() as tx:
        teams, next_teams = team_rows(tx, query)
        tokens, next_tokens = token_rows(tx, query)
        kinds = sorted({p.pool.gpu for p in effective_pools(tx, request.app.state.settings.local_gpus)})
    return page(request, session, "admin.html", title="Admin", query=query, teams=teams, next_teams=next_teams,
                tokens=tokens, next_tokens=next_tokens, kinds=kinds, created=created, refusal=refusal,
                notice=notice, status_code=status_code, form=form or {})


@router.get("/ui/admin")
def admin_page(request: Request, session: SignedAdmin, db: Db,
               revoked_id: Annotated[str, Query(alias="revoked_id", max_length=32)] = "",
               saved: Annotated[str, Query(max_length=63)] = "") -> Response:
    notice = None
    if revoked_id:
        notice = f"Token {revoked_id} is revoked: it no longer signs in or calls the API."
    elif saved:
        notice = f"Team {saved}'s quota is saved."
    return render(request, session, db, notice=notice)


def _int(fields: list[tuple[str, str]], name: str, text: str, *, required: bool) -> int | None:
    if not text.strip():
        if required:
            fields.append((name, "required: a whole number of GPUs, 0 or more"))
        return None
    try:
        return int(text)
    except ValueError:
        fields.append((name, f"{text!r} is not a whole number"))
        return None


def _api_refusal(title: str, exc: ApiError) -> Refusal:
    return Refusal(title, exc.message, [(f.loc, f.message) for f in exc.fields])


@router.post("/ui/admin/quota")
def save_quota(request: Request, session: Csrf, admin: SignedAdmin, db: Db,
               team: Annotated[str, Form(max_length=63)] = "", gpu: Annotated[str, Form(max_length=64)] = "",
               nominal: Annotated[str, Form(max_length=12)] = "",
               borrowing_limit: Annotated[str, Form(max_length=12)] = "",
               lending_limit: Annotated[str, Form(max_length=12)] = "",
               weight: Annotated[str, Form(max_length=12)] = "",
               max_priority: Annotated[str, Form(max_length=12)] = "") -> Response:
    form = {"team": team, "gpu": gpu, "nominal": nominal, "borrowing_limit": borrowing_limit,
            "lending_limit": lending_limit, "weight": weight, "max_priority": max_priority}
    fields: list[tuple[str, str]] = []
    if not team.strip():
        fields.append(("team", "required: the team's name"))
    else:
        try:
            check_label(team.strip())
        except ValueError as exc:
            fields.append(("team", str(exc)))
    if not gpu.strip():
        fields.append(("gpu", "required: a GPU kind some pool has"))
    flavor = {"nominal": _int(fields, "nominal", nominal, required=True),
              "borrowing_limit": _int(fields, "borrowing_limit", borrowing_limit, required=False),
              "lending_limit": _int(fields, "lending_limit", lending_limit, required=False)}
    with db.begin() as tx:
        existing = tx.scalar(select(TeamQuotaRow.quota).join(Team, Team.id == TeamQuotaRow.team_id)
                             .where(Team.name == team.strip()))
    base = (existing or TeamQuota()).model_dump()
    updates: dict[str, Any] = {}
    if weight.strip():
        try:
            updates["weight"] = float(weight)
        except ValueError:
            fields.append(("weight", f"{weight!r} is not a number"))
    if max_priority.strip():
        updates["max_priority"] = _int(fields, "max_priority", max_priority, required=False)
    if fields:
        return render(request, session, db, status_code=422, form=form,
                      refusal=Refusal("Quota not saved", "Fix the fields named below.", fields))
    try:
        flavors = {**base["flavors"], gpu.strip(): FlavorQuota.model_validate(flavor).model_dump()}
        quota = TeamQuota.model_validate({**base, **updates, "flavors": flavors})
    except ValidationError as exc:
        named = [(field_path(tuple(e["loc"])) or "quota", str(e["msg"])) for e in exc.errors()]
        return render(request, session, db, status_code=422, form=form,
                      refusal=Refusal("Quota not saved", "Fix the fields named below.", named))
    try:
        declare_quota(db, session.principal, team.strip(), quota, local_gpus=request.app.state.settings.local_gpus)
    except ApiError as exc:
        return render(request, session, db, status_code=exc.status, form=form,
                      refusal=_api_refusal("Quota not saved", exc))
    return RedirectResponse(f"/ui/admin?saved={team.strip()}#teams", status_code=303)


@router.post("/ui/admin/tokens")
def create_token(request: Request, session: Csrf, admin: SignedAdmin, db: Db,
                 role: Annotated[str, Form(max_length=16)] = "member",
                 team: Annotated[str, Form(max_length=63)] = "",
                 name: Annotated[str, Form(max_length=200)] = "",
                 expires_days: Annotated[str, Form(max_length=8)] = "") -> Response:
    form = {"role": role, "token_team": team, "name": name, "expires_days": expires_days}
    fields: list[tuple[str, str]] = []
    expires_s = None
    if expires_days.strip():
        try:
            expires_s = round(float(expires_days) * 86400)
        except ValueError:
            fields.append(("expires_days", f"{expires_days!r} is not a number of days"))
    if role not in {r.value for r in TEAM_ROLES}:
        fields.append(("role", "member or admin"))
    if fields:
        return render(request, session, db, status_code=422, form=form,
                      refusal=Refusal("Token not created", "Fix the fields named below.", fields))
    try:
        body = TokenIn(role=Role(role), team=team.strip() or None, name=name.strip() or None,
                       expires_in_s=expires_s)
    except ValidationError as exc:
        named = [(field_path(tuple(e["loc"])) or "token", str(e["msg"]).removeprefix("Value error, "))
                 for e in exc.errors()]
        return render(request, session, db, status_code=422, form=form,
                      refusal=Refusal("Token not created", "Fix the fields named below.", named))
    try:
        created = issue_token(db, session.principal, body)
    except ApiError as exc:
        return render(request, session, db, status_code=exc.status, form=form,
                      refusal=_api_refusal("Token not created", exc))
    except NotFound as exc:
        return render(request, session, db, status_code=404, form=form,
                      refusal=Refusal("Token not created", f"{exc}: create it first (set its quota below, or"
                                      " POST /v1/teams)", [("team", "no such team")]))
    return render(request, session, db, created=created, status_code=201)


@router.post("/ui/admin/tokens/{token_id}/revoke")
def revoke_token(request: Request, session: Csrf, admin: SignedAdmin, db: Db,
                 token_id: Annotated[str, Path(min_length=4, max_length=32)]) -> Response:
    try:
        done = revoke(db, session.principal, token_id)
    except ApiError as exc:
        return render(request, session, db, status_code=exc.status, refusal=_api_refusal("Token not revoked", exc))
    except Conflict as exc:  # a prefix that matches several tokens
        return render(request, session, db, status_code=409, refusal=Refusal("Token not revoked", str(exc), []))
    return RedirectResponse(f"/ui/admin?revoked_id={done.id}#tokens", status_code=303)
