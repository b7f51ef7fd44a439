"""The contract hook: every response the suite gets through the Flask test client is checked against
openapi.yaml, so the document cannot drift from the code. conftest's `app` fixture installs it."""

import functools
import json

from flask.testing import FlaskClient
from openapi_core import Config, OpenAPI
from openapi_core.contrib.werkzeug import WerkzeugOpenAPIRequest, WerkzeugOpenAPIResponse
from openapi_core.templating.paths.exceptions import OperationNotFound, PathNotFound

from partner.edge import apidocs


@functools.cache
def openapi(path=apidocs.DOCUMENT_PATH) -> OpenAPI:
    # openapi-core knows application/json; errors are application/problem+json, JSON as well.
    config = Config(extra_media_type_deserializers={"application/problem+json": json.loads})
    return OpenAPI.from_dict(apidocs.document(path), config=config)


class _AnsweredRequest(WerkzeugOpenAPIRequest):
    """The request a response answers. Its body was consumed by the app, and no response check needs it."""

    @property
    def body(self) -> bytes:
        return b""


def check_response(response) -> None:
    """Raise if the document (openapi.yaml, or openapi-internal.yaml for the publish endpoints) describes
    the request's path and method and the response breaks it.
    Paths and methods the document leaves out (ops endpoints, unknown paths, 405s) are not checked."""
    request = _AnsweredRequest(response.request)
    if "//" in request.path:
        return  # an empty path parameter: no documented operation (subscription_id has minLength 1)
    try:
        internal = request.path.startswith("/internal/v1/")  # the publish endpoints: their own document
        document = openapi(apidocs.INTERNAL_DOCUMENT_PATH if internal else apidocs.DOCUMENT_PATH)
        document.validate_response(request, WerkzeugOpenAPIResponse(response))
    except (PathNotFound, OperationNotFound):
        return
    except Exception as error:
        raise AssertionError(f"{request.method.upper()} {request.path} -> {response.status_code} "
                             f"breaks openapi.yaml: {_explain(error)}\n{response.get_data(as_text=True)[:2000]}"
                             ) from error


def _explain(error: Exception) -> str:
    # openapi-core wraps the schema errors; the innermost ones say which field broke which rule.
    causes = getattr(error, "schema_errors", None) or getattr(error.__cause__, "schema_errors", None)
    return "; ".join(str(cause.message) for cause in causes) if causes else repr(error)


class ContractClient(FlaskClient):
    """A test client that checks each response against the OpenAPI document."""

    def open(self, *args, **kwargs):
        response = super().open(*args, **kwargs)
        check_response(response)
        return response
