"""Who may call an operation, where the operation itself decides it (visibility of a job or a team
is the store's: `service.store.visibility`, `visible_job`)."""

from __future__ import annotations

from service.api.errors import ApiError
from service.store.tokens import Principal
from service.store.vocab import Role


def admin_only(principal: Principal) -> None:
    """A 403 `forbidden` unless `principal` is an admin. The admin-only operations check it
    themselves; the API's `Admin` dependency (`service.api.deps.require_admin`) makes the same check,
    with the same words, before the route runs."""
    if principal.role != Role.ADMIN:
        raise ApiError(403, "forbidden", "this needs an admin token")
