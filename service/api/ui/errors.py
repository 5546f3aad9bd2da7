"""The dashboard's errors: raised by routes and dependencies, answered as HTML pages (`install`).

- `UiError(status, title, message)`: an error page with that status (404 for a job the session may
  not see, in the same words as a missing one; 403 for admin pages and missing CSRF tokens).
- `SignInRequired(next_path)`: a 303 to `/ui/login?next=...`; for an htmx request a 401 with
  `HX-Redirect`, so the whole page goes to the sign-in form rather than a fragment of it.
- `NotFound` from the store raised inside a `/ui/` route is a 404 page too (the API answers JSON).
"""

from __future__ import annotations

from urllib.parse import quote

import anyio.to_thread
from fastapi import FastAPI, Request
from starlette.responses import RedirectResponse, Response

from service.store.tokens import NotFound

LOGIN_PATH = "/ui/login"


class UiError(Exception):
    def __init__(self, status: int, title: str, message: str) -> None:
        super().__init__(message)
        self.status, self.title, self.message = status, title, message


class SignInRequired(Exception):
    def __init__(self, next_path: str) -> None:
        super().__init__(next_path)
        self.next_path = next_path


def login_url(next_path: str | None) -> str:
    return f"{LOGIN_PATH}?next={quote(next_path, safe='/')}" if next_path else LOGIN_PATH


def is_ui(request: Request) -> bool:
    return request.url.path == "/ui" or request.url.path.startswith("/ui/")


def install(app: FastAPI, previous_not_found: object) -> None:
    """Register the handlers. `previous_not_found` is the API's `NotFound` handler, kept for API paths."""
    from service.api.ui.render import error_page  # render imports session, which imports this module

    @app.exception_handler(UiError)
    async def _ui_error(request: Request, exc: UiError) -> Response:
        return await anyio.to_thread.run_sync(error_page, request, exc.status, exc.title, exc.message)

    @app.exception_handler(SignInRequired)
    async def _sign_in(request: Request, exc: SignInRequired) -> Response:
        target = login_url(exc.next_path)
        if request.headers.get("hx-request"):
            return Response(status_code=401, headers={"HX-Redirect": target})
        return RedirectResponse(target, status_code=303)

    @app.exception_handler(NotFound)
    async def _not_found(request: Request, exc: NotFound) -> Response:
        if is_ui(request):
            return await anyio.to_thread.run_sync(error_page, request, 404, "Not found",
                                                  f"{exc}: it does not exist, or your token may not see it.")
        assert callable(previous_not_found)
        response: Response = await previous_not_found(request, exc)
        return response
