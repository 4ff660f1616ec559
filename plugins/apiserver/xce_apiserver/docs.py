"""The browsable API reference (Swagger UI) from assets shipped with xce: no CDN.

FastAPI's own ``/docs`` page loads Swagger UI's script and style from a public CDN, so on an
air-gapped cluster it shows nothing. Here the page is the same, but its assets come from the
``swagger-ui-bundle-v2`` wheel (Swagger UI 5, Apache-2.0, which renders OpenAPI 3.1), served
by the API server itself under ``<prefix>/docs/assets/``.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from starlette.staticfiles import StaticFiles


def mount_docs(app: FastAPI, prefix: str, openapi_url: str, title: str) -> None:
    """Serve Swagger UI at ``<prefix>/docs`` with its assets at ``<prefix>/docs/assets``."""
    from swagger_ui_bundle import swagger_ui_path

    assets = f"{prefix}/docs/assets"
    app.mount(assets, StaticFiles(directory=str(swagger_ui_path)), name="swagger-ui-assets")

    @app.get(f"{prefix}/docs", include_in_schema=False, response_class=HTMLResponse)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url, title=f"{title} - API reference",
            swagger_js_url=f"{assets}/swagger-ui-bundle.js",
            swagger_css_url=f"{assets}/swagger-ui.css",
            swagger_favicon_url=f"{assets}/favicon-32x32.png")
