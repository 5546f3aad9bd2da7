"""`/docs` (Swagger UI) and `/redoc` (ReDoc) on the vendored files in `static/vendor/`, so that the API's
documentation works without reaching a CDN (air-gapped installations). The app is created with
`docs_url=None, redoc_url=None` and these routes take their place."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from starlette.responses import HTMLResponse

from service.api.ui.render import STATIC_URL

VENDOR = f"{STATIC_URL}/vendor"
FAVICON = f"{STATIC_URL}/favicon.svg"


def mount_docs(app: FastAPI) -> None:
    openapi_url = app.openapi_url or "/openapi.json"
    title = app.title

    def swagger() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url=openapi_url, title=f"{title} - Swagger UI",
                                   swagger_js_url=f"{VENDOR}/swagger-ui/swagger-ui-bundle.js",
                                   swagger_css_url=f"{VENDOR}/swagger-ui/swagger-ui.css",
                                   swagger_favicon_url=FAVICON,
                                   oauth2_redirect_url="/docs/oauth2-redirect")

    def oauth2_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    def redoc() -> HTMLResponse:
        return get_redoc_html(openapi_url=openapi_url, title=f"{title} - ReDoc",
                              redoc_js_url=f"{VENDOR}/redoc/redoc.standalone.js", redoc_favicon_url=FAVICON,
                              with_google_fonts=False)

    app.add_api_route("/docs", swagger, include_in_schema=False)
    app.add_api_route("/docs/oauth2-redirect", oauth2_redirect, include_in_schema=False)
    app.add_api_route("/redoc", redoc, include_in_schema=False)
