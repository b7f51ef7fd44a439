"""Headers on every response: no cache keeps an answer (the 201 that shows a secret above all), and
no browser second-guesses a content type."""

from flask import Flask, Response


def install_response_headers(app: Flask) -> None:
    app.after_request(_add_headers)


def _add_headers(response: Response) -> Response:
    response.headers["X-Content-Type-Options"] = "nosniff"
    # Only the /docs assets choose their own caching (a day: they are files of a pinned package).
    if "Cache-Control" not in response.headers:
        response.headers["Cache-Control"] = "no-store"
    if response.status_code == 204:  # no content, so no type (Flask gives every response text/html)
        del response.headers["Content-Type"]
    return response
