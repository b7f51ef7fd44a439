"""The request body, read as the API reads every body: whole, bounded, and a JSON object naming each
field once (I-JSON, RFC 7493)."""

import json
import logging

from flask import request
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from partner.errors import ApiError

log = logging.getLogger(__name__)


def read_json_object() -> dict:
    """The request body as a JSON object (I-JSON: each name once), or 400 invalid_json saying why: where
    the JSON breaks (line and column), which rule it breaks, or that it is no object."""
    try:
        body = json.loads(read_body(), parse_constant=_reject_constant, object_pairs_hook=_unique_names)
        # I-JSON (RFC 7493): a lone surrogate ("\ud800") parses, but no database or hash takes it.
        json.dumps(body, ensure_ascii=False).encode()
    except json.JSONDecodeError as error:
        raise _invalid_json(f"The request body is not valid JSON: {error.msg} at line {error.lineno}, "
                            f"column {error.colno}.") from None
    except NotIJson as error:
        raise _invalid_json(f"The request body {error}.") from None
    except UnicodeError:
        raise _invalid_json("The request body must be UTF-8 text, with no lone surrogate (\\ud800).") from None
    except RecursionError:
        raise _invalid_json("The request body nests arrays or objects too deeply.") from None
    except ValueError:  # what else Python refuses to read (a number of thousands of digits)
        raise _invalid_json("The request body is not JSON this API can read.") from None
    if not isinstance(body, dict):
        raise _invalid_json("The request body must be a JSON object, naming each field once.")
    return body


class NotIJson(ValueError):
    """JSON that Python reads but I-JSON (RFC 7493) refuses; says which rule it breaks."""


def _invalid_json(detail: str) -> ApiError:
    return ApiError(400, "invalid_json", detail)


def read_body() -> bytes:
    """The whole request body, or 413 past MAX_CONTENT_LENGTH however it is framed. Werkzeug refuses
    a Content-Length over the limit but stops reading a chunked body at it, silently: one more byte
    from the server's own stream says whether the body went on."""
    try:
        data = request.get_data(cache=False)
        beyond = len(data) >= request.max_content_length and request.environ["wsgi.input"].read(1)
    except HTTPException:
        raise
    except Exception as error:  # noqa: BLE001 - the server's own decoding failed (a bad chunk), whichever server
        log.info("unreadable request body: %s", type(error).__name__)
        raise ApiError(400, "invalid_json",
                       "The request body could not be read (malformed chunked encoding).") from None
    if beyond:
        raise RequestEntityTooLarge()
    return data


def _unique_names(pairs: list[tuple]) -> dict:
    # I-JSON again: a name given twice means what the parser decides (here the last value, elsewhere
    # the first), the kind of doubt the SSRF rule refuses in a URL.
    body = dict(pairs)
    if len(body) != len(pairs):
        raise NotIJson("names a field twice in one object; a JSON object names each field once")
    return body


def _reject_constant(name: str):
    # json.loads accepts NaN and Infinity, which are not JSON.
    raise NotIJson(f"holds {name}, which is not a JSON value")
