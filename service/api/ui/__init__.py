"""The operators' dashboard, served by the API process under `/ui/` (see docs/dashboard.md).

Server-rendered pages (Jinja2) with htmx for partial updates and server-sent events for live rows,
events and logs; no front-end build step (the vendored files are in `static/vendor/`, see VENDOR.md).

Layout of this package:

- `session.py`: the sign-in cookie, CSRF, and the dependencies routes take (`Signed`, `SignedAdmin`, `Csrf`).
- `render.py`: the Jinja2 environment and filters; `page`, `fragment`, `error_page`.
- `errors.py`: `UiError` (an error page), `SignInRequired` (to the sign-in form), their handlers.
- `nav.py`: the header's entries.
- `live.py`: the server-sent-events response the live parts of pages use.
- `docs_assets.py`: `/docs` and `/redoc` on the vendored Swagger UI and ReDoc.
- `limits.py`: POSTs under `/ui/` are small URL-encoded forms (415, 413 otherwise).
- `routers/`: one module per page (thin: they call the store's and the API's plain functions, which
  apply the same visibility as the API).
- `templates/`, `static/`.

`mount_ui(app)` adds all of it to the API app; `create_app` calls it.
"""

from __future__ import annotations

from fastapi import APIRouter, FastAPI
from fastapi.staticfiles import StaticFiles
from starlette.responses import RedirectResponse

from service.api.ui import error_pages
from service.api.ui.limits import UiBodyLimit
from service.api.ui.render import STATIC_DIR, STATIC_URL
from service.api.ui.routers import admin, auth, job, jobs, plan, pools, queue, teams
from service.store.tokens import NotFound

#: Every page's router, in the order they are mounted. Add new pages here (and to `nav.NAV`).
PAGE_ROUTERS: list[APIRouter] = [auth.router, jobs.router, job.router, queue.router, teams.router, pools.router,
                                  plan.router, admin.router]


def _home() -> RedirectResponse:
    return RedirectResponse("/ui/jobs", status_code=303)


def mount_ui(app: FastAPI) -> None:
    """Mount the dashboard on `app`: its pages, static files and error handlers. Call after the API's
    error handlers are installed (`error_pages.install` keeps the API's `NotFound` answer for API paths)."""
    error_pages.install(app, app.exception_handlers.get(NotFound))
    app.add_api_route("/ui", _home, include_in_schema=False)
    app.add_api_route("/ui/", _home, include_in_schema=False)
    for router in PAGE_ROUTERS:
        app.include_router(router, include_in_schema=False)
    app.mount(STATIC_URL, StaticFiles(directory=STATIC_DIR), name="ui-static")
    app.add_middleware(UiBodyLimit)  # added before the request gate: it runs inside it
