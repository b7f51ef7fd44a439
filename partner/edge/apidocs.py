"""The API described: /openapi.json (from openapi.yaml, the one source) and /docs, a Swagger UI page
whose every asset is served from here (the pinned swagger-ui-py package), never from a CDN.

Outside /api/v1/partner: no key, no rate limit."""

import functools
import importlib.util
import json
from pathlib import Path

import yaml
from flask import Blueprint, Flask, Response, abort, current_app, send_from_directory

from partner.edge.described_events import LiveDocument

DOCUMENT_PATH = Path(__file__).resolve().parents[2] / "openapi.yaml"
# The publish endpoints' own document (partner/edge/publish_api.py), for the platform's services.
INTERNAL_DOCUMENT_PATH = DOCUMENT_PATH.with_name("openapi-internal.yaml")

# The few files of the swagger-ui-py package the page loads; its other assets (the editor) are not served.
SWAGGER_ASSETS = frozenset({"swagger-ui.css", "swagger-ui-bundle.js", "favicon-32x32.png"})

# The browser itself refuses anything from another origin. Swagger UI sets inline styles and data: images.
CONTENT_SECURITY_POLICY = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
                           "img-src 'self' data:; connect-src 'self'; object-src 'none'; "
                           "frame-ancestors 'none'; base-uri 'none'; form-action 'none'")

PAGE = """<!doctype html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <title>Partner Integration Service API</title>
  <link rel="stylesheet" href="/docs/assets/swagger-ui.css">
  <link rel="icon" type="image/png" href="/docs/assets/favicon-32x32.png">
</head>
<body>
  <div id="swagger-ui"></div>
  <script src="/docs/assets/swagger-ui-bundle.js"></script>
  <script src="/docs/init.js"></script>
</body>
</html>
"""

# validatorUrl null: Swagger UI would otherwise fetch a badge from a public validator.
INIT_SCRIPT = """window.ui = SwaggerUIBundle({
  url: "/openapi.json",
  dom_id: "#swagger-ui",
  deepLinking: true,
  validatorUrl: null,
  defaultModelsExpandDepth: 0
});
"""

docs = Blueprint("apidocs", __name__)


def install_docs(app: Flask) -> None:
    """The routes, and the partner's document with the registry's event types, built at its first use."""
    app.extensions["api_document"] = functools.cache(lambda: LiveDocument(document(), app.config["CLOCK"]))
    app.register_blueprint(docs)


@functools.cache
def document(path: Path = DOCUMENT_PATH) -> dict:
    """An OpenAPI document, parsed once per process."""
    return yaml.safe_load(path.read_text(encoding="utf-8"))


@functools.cache
def _internal_json() -> str:
    return json.dumps(document(INTERNAL_DOCUMENT_PATH), ensure_ascii=False)




@functools.cache
def _swagger_ui_dir() -> Path:
    # find_spec locates the package without importing it (its __init__ loads framework handlers).
    return Path(importlib.util.find_spec("swagger_ui").submodule_search_locations[0]) / "static"


@docs.get("/openapi.json")
def openapi_json():
    return Response(current_app.extensions["api_document"]().text(), mimetype="application/json")


@docs.get("/internal/openapi.json")
def internal_openapi_json():
    return Response(_internal_json(), mimetype="application/json")


@docs.get("/docs")
def docs_page():
    return _page(PAGE, "text/html")


@docs.get("/docs/init.js")
def docs_init():
    return _page(INIT_SCRIPT, "text/javascript")


@docs.get("/docs/assets/<name>")
def docs_asset(name: str):
    if name not in SWAGGER_ASSETS:
        abort(404)
    response = send_from_directory(_swagger_ui_dir(), name, max_age=86400)
    response.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    return response


def _page(text: str, mimetype: str) -> Response:
    response = Response(text, mimetype=mimetype)
    response.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    return response
