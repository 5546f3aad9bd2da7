"""The dashboard's error pages: the handlers that answer `errors.UiError`, `errors.SignInRequired` and a
store `NotFound` inside `/ui/` as HTML (a redirect to sign in for the second)."""

from __future__ import annotations

import anyio.to_thread
from fastapi import FastAPI, Request
from starlette.responses import RedirectResponse, Response

from service.api.ui.errors import SignInRequired, UiError, is_ui, login_url
from service.api.ui.render import error_page
from service.store.tokens import NotFound


def install(app: FastAPI, previous_not_found: object) -> None:
    """Register the handlers. `previous_not_found` is the API's `NotFound` handler, kept for API paths."""
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
