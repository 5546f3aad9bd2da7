"""The dashboard's navigation: one entry per page, in the order the header shows them.

To add a page: write its router in `service/api/ui/routers/`, list the router in
`service.api.ui.PAGE_ROUTERS`, and add its `NavEntry` here. `admin=True` hides the entry from
members; the route itself must still refuse them (`session.SignedAdmin`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class NavEntry:
    label: str
    path: str  # the page's URL; the entry is marked current on this path and below it
    admin: bool = False


NAV: list[NavEntry] = [
    NavEntry("Jobs", "/ui/jobs"),
    NavEntry("Queue", "/ui/queue"),
    NavEntry("Teams", "/ui/teams"),
    NavEntry("Pools", "/ui/pools"),
    NavEntry("Plan", "/ui/plan"),
    NavEntry("Admin", "/ui/admin", admin=True),
]


def visible_nav(is_admin: bool) -> list[NavEntry]:
    return [entry for entry in NAV if is_admin or not entry.admin]
