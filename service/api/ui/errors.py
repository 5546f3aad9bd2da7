"""The dashboard's errors: raised by routes and dependencies, answered as HTML pages
(`service.api.ui.error_pages.install`).

- `UiError(status, title, message)`: an error page with that status (404 for a job the session may
  not see, in the same words as a missing one; 403 for admin pages and missing CSRF tokens).
- `SignInRequired(next_path)`: a 303 to `/ui/login?next=...`; for an htmx request a 401 with
  `HX-Redirect`, so the whole page goes to the sign-in form rather than a fragment of it.
- `NotFound` from the store raised inside a `/ui/` route is a 404 page too (the API answers JSON).
"""

from __future__ import annotations

from urllib.parse import quote

from fastapi import Request

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
