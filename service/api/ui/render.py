"""Rendering: the Jinja2 environment, its filters, and the helpers routes answer with.

- `page(request, session, "jobs.html", title=..., **context)`: a full page on `base.html`. Every
  template gets `session` (the `UiSession`, or None on the sign-in page), `csrf` (put it in every
  form as `<input type="hidden" name="csrf" value="{{ csrf }}">`; htmx requests send it as a header),
  `nav`, `current` (the request path) and `title`.
- `fragment(request, session, "_rows.html", **context)`: a partial for htmx swaps and live streams,
  with the same context; `fragment_text` renders one to a string (an SSE message's data).
- Templates live in `service/api/ui/templates/`; autoescaping is on; the filters are below
  (`duration`, `when`, `ago`, `bytes`, `pct`, `num`).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.templating import Jinja2Templates
from starlette.responses import HTMLResponse

from service.api.ui.nav import visible_nav
from service.api.ui.session import UiSession, current_session

TEMPLATES_DIR = Path(__file__).parent / "templates"
STATIC_DIR = Path(__file__).parent / "static"
STATIC_URL = "/ui/static"


def duration(seconds: float | None) -> str:
    """1.23 s, 4 min 05 s, 2 h 03 min, 3 d 4 h; '-' for None."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    if seconds < 0:
        seconds = 0.0
    if seconds < 10:
        return f"{seconds:.2f} s" if seconds < 1 else f"{seconds:.1f} s"
    whole = round(seconds)
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s" if whole >= 60 else f"{whole} s"
    if whole < 86400:
        return f"{whole // 3600} h {whole % 3600 // 60:02d} min"
    return f"{whole // 86400} d {whole % 86400 // 3600} h"


def when(value: datetime | None) -> str:
    """A UTC time as `2026-12-01 04:05:06 UTC`; '-' for None."""
    if value is None:
        return "-"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def ago(value: datetime | None, now: datetime | None = None) -> str:
    if value is None:
        return "-"
    now = now or datetime.now(UTC)
    return duration((now - value).total_seconds()) + " ago"


def human_bytes(value: float | None) -> str:
    if value is None:
        return "-"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def num(value: float | None, digits: int = 3) -> str:
    """A number with `digits` significant digits, thousands separated; '-' for None."""
    if value is None:
        return "-"
    if isinstance(value, int) or (float(value).is_integer() and abs(value) >= 1000):
        return f"{int(value):,}"
    return f"{value:,.{digits}g}" if abs(value) < 1e6 else f"{value:,.0f}"


templates = Jinja2Templates(directory=str(TEMPLATES_DIR))
templates.env.filters.update(duration=duration, when=when, ago=ago, bytes=human_bytes, pct=pct, num=num)
templates.env.globals.update(static=STATIC_URL)


def _context(request: Request, session: UiSession | None, context: dict[str, Any]) -> dict[str, Any]:
    return {"session": session, "csrf": session.csrf if session else "",
            "nav": visible_nav(session.is_admin if session else False),
            "current": request.url.path, **context}


def page(request: Request, session: UiSession | None, template: str, *, title: str, status_code: int = 200,
         **context: Any) -> HTMLResponse:
    return templates.TemplateResponse(request, template, _context(request, session, {"title": title, **context}),
                                      status_code=status_code)


def fragment(request: Request, session: UiSession | None, template: str, status_code: int = 200,
             **context: Any) -> HTMLResponse:
    return templates.TemplateResponse(request, template, _context(request, session, context),
                                      status_code=status_code)


def fragment_text(template: str, **context: Any) -> str:
    """A template rendered to a string (no request: for SSE messages rendered off the request)."""
    return templates.env.get_template(template).render(**context)


def error_page(request: Request, status: int, title: str, message: str) -> HTMLResponse:
    """The error page, shown inside the layout when the session is known (so the header still works)."""
    session: UiSession | None = None
    factory = getattr(request.app.state, "sessions", None)
    if factory is not None and status != 401:
        session = current_session(request, factory)
    if request.headers.get("hx-request"):
        return fragment(request, session, "_error.html", status_code=status, status=status, heading=title,
                        message=message)
    return page(request, session, "error.html", title=title, status_code=status, status=status, heading=title,
                message=message)
