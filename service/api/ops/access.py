"""Who may call an operation, where the operation itself decides it (visibility of a job or a team
is the store's: `service.store.visibility`, `visible_job`)."""

from __future__ import annotations

from service.api.errors import ApiError
from service.api.schemas import ErrorField
from service.store.tokens import Principal
from service.store.vocab import Role


def admin_only(principal: Principal) -> None:
    """A 403 `forbidden` unless `principal` is an admin. The admin-only operations check it
    themselves; the API's `Admin` dependency (`service.api.deps.require_admin`) makes the same check,
    with the same words, before the route runs."""
    if principal.role != Role.ADMIN:
        raise ApiError(403, "forbidden", "this needs an admin token")


def acting_team(principal: Principal, named: str | None) -> str | None:
    """The team a request acts for, given the team it names (None: named none): a member's own team,
    a 403 `forbidden` naming the field when it names another; an admin's (or a job token's) as named.
    Submissions, calibration and webhooks all decide by this."""
    if principal.role != Role.MEMBER:
        return named
    if named is not None and named != principal.team_name:
        raise ApiError(403, "forbidden", f"your token belongs to team {principal.team_name!r}: leave team out"
                       f" or set it to {principal.team_name}",
                       fields=[ErrorField(loc="team", message=f"leave it out or set it to {principal.team_name}")])
    return principal.team_name
