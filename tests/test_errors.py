"""Every error is RFC 9457 problem+json with the contract's code; nothing leaks."""

import json
import threading

import pytest
from werkzeug.serving import make_server

from tests.support import WEBHOOKS, assert_problem, raw_exchange



@pytest.mark.parametrize("data", [b"{", b"[]", b"\"x\"", b"null", b"\xff\xfe", b"{\"a\": NaN}", b"[" * 60000])
def test_body_that_is_not_a_json_object_is_400(client, auth, data):
    assert_problem(client.post(WEBHOOKS, data=data, headers=auth), 400, "invalid_json")


def test_unknown_path_is_404(client):
    assert_problem(client.get("/api/v1/partner/nope"), 404, "not_found")
    assert_problem(client.get("/"), 404, "not_found")


def test_wrong_method_is_405_and_keeps_allow(client, auth):
    response = client.put("/api/v1/partner/me", headers=auth)
    assert_problem(response, 405, "method_not_allowed")
    assert set(response.headers["Allow"].split(", ")) >= {"GET", "HEAD", "OPTIONS"}


def test_body_over_64_kib_is_413_naming_the_limit(client, auth):
    body = b'{"url": "' + b"a" * 70000 + b'"}'
    problem = assert_problem(client.post(WEBHOOKS, data=body, headers=auth), 413, "payload_too_large")
    assert problem["detail"] == "The request body is over 64 KiB, the most this API accepts."


@pytest.mark.config(MAX_CONTENT_LENGTH=1000)
def test_the_413_names_the_limit_configured(client, auth):
    problem = assert_problem(client.post(WEBHOOKS, data=b" " * 1001, headers=auth), 413, "payload_too_large")
    assert problem["detail"] == "The request body is over 1000 bytes, the most this API accepts."


@pytest.mark.parametrize("data, detail", [
    (b'{"url": "http://93.184.215.14/",\n "description": }',
     "The request body is not valid JSON: Expecting value at line 2, column 17."),
    (b'{"url": "http://93.184.215.14/" "description": "a"}',
     "The request body is not valid JSON: Expecting ',' delimiter at line 1, column 33."),
    (b"", "The request body is not valid JSON: Expecting value at line 1, column 1."),
    (b'{"a": NaN}', "The request body holds NaN, which is not a JSON value."),
    (b"[]", "The request body must be a JSON object, naming each field once."),
    (b'{"a": "\\ud800"}', "The request body must be UTF-8 text, with no lone surrogate (\\ud800)."),
    (b"[" * 60000, "The request body nests arrays or objects too deeply."),
    (b'{"a": 1' + b"0" * 5000 + b"}", "The request body is not JSON this API can read."),
])
def test_invalid_json_says_where_or_which_rule(client, auth, data, detail):
    assert assert_problem(client.post(WEBHOOKS, data=data, headers=auth), 400, "invalid_json")["detail"] == detail


def test_unexpected_exception_is_a_bare_500(app, caplog):
    @app.get("/boom")
    def boom():
        raise RuntimeError("internal detail: whsec_do_not_show")

    response = app.test_client().get("/boom")
    body = assert_problem(response, 500, "internal_error")
    assert "whsec_do_not_show" not in response.get_data(as_text=True)
    assert body["detail"] == "An unexpected error occurred."
    assert "Traceback" not in response.get_data(as_text=True)


@pytest.mark.parametrize("data", [b'{"url": "http://10.0.0.1/", "url": "http://93.184.215.14/"}',
                                  b'{"url": "http://93.184.215.14/", "description": "a", "description": "b"}'])
def test_a_name_given_twice_is_invalid_json(client, auth, data):
    """I-JSON (RFC 7493): parsers differ on which of two values counts, as they do on an odd URL."""
    body = assert_problem(client.post(WEBHOOKS, data=data, headers=auth), 400, "invalid_json")
    assert body["detail"] == ("The request body names a field twice in one object; a JSON object names each field "
                              "once.")
    assert client.get(WEBHOOKS, headers=auth).get_json()["data"] == []


@pytest.mark.parametrize("data", [b'{"url": "http://93.184.215.14/", "description": "\\ud800"}',
                                  b'{"url": "http://93.184.215.14/", "\\udfff": 1}'])
def test_a_lone_surrogate_is_invalid_json(client, auth, data):
    assert_problem(client.post(WEBHOOKS, data=data, headers=auth), 400, "invalid_json")
    assert client.get(WEBHOOKS, headers=auth).get_json()["data"] == []


def test_a_body_no_server_can_read_is_400_under_any_wsgi_server(app, auth):
    """Not only under gunicorn: Werkzeug's own server fails a malformed chunk in its own way."""
    server = make_server("127.0.0.1", 0, app, threaded=True)
    threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True).start()
    try:
        status, headers, body = raw_exchange(server.server_port, (
            f"POST {WEBHOOKS} HTTP/1.1\r\nHost: x\r\nAuthorization: {auth['Authorization']}\r\n"
            "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n").encode())
    finally:
        server.shutdown()
    assert (status, headers["content-type"]) == (400, "application/problem+json")
    assert json.loads(body)["code"] == "invalid_json"
