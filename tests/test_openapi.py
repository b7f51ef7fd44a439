"""The API described (apidocs.py, openapi.yaml): the document is valid OpenAPI 3.1, says what the code
does (routes, scopes, statuses, headers), and /openapi.json and /docs serve it with no key and no CDN."""

import re

import pytest
from flask.testing import FlaskClient
from openapi_spec_validator import validate
from openapi_spec_validator.validation.exceptions import OpenAPIValidationError

from partner.edge import apidocs
from tests.contract import ContractClient, check_response
from tests.support import API

DOCUMENT = apidocs.document()
OPERATIONS = [(path, method, operation) for path, item in DOCUMENT["paths"].items()
              for method, operation in item.items() if method != "parameters"]
OPERATION_IDS = [f"{method.upper()} {path}" for path, method, _ in OPERATIONS]
WEBHOOK_HEADERS = ["X-VC-Signature", "X-VC-Timestamp", "X-VC-Event", "X-VC-Event-Id", "X-VC-Attempt",
                   "webhook-id", "webhook-timestamp", "webhook-signature"]


def statuses(operation) -> set[str]:
    return set(operation["responses"])


def resolve(node: dict) -> dict:
    """Follow a local $ref ("#/components/...") once."""
    if "$ref" not in node:
        return node
    target = DOCUMENT
    for part in node["$ref"].removeprefix("#/").split("/"):
        target = target[part]
    return target


# --- the document is valid and served -------------------------------------------------------------

def test_served_document_is_valid_openapi_3_1(client):
    response = client.get("/openapi.json")
    assert response.status_code == 200
    assert response.mimetype == "application/json"
    served = response.get_json()
    assert served == DOCUMENT
    assert served["openapi"].startswith("3.1.")
    validate(served)  # openapi-spec-validator raises on any error


def test_the_validator_can_fail():
    broken = {**DOCUMENT, "paths": {"/me": {"get": {"responses": {"200": {}}}}}}
    with pytest.raises(OpenAPIValidationError):
        validate(broken)


def test_document_describes_exactly_the_routes_the_app_serves(app):
    served = {(re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", rule.rule), method.lower())
              for rule in app.url_map.iter_rules() if rule.rule.startswith(API)
              for method in rule.methods - {"HEAD", "OPTIONS"}}
    assert {(path, method) for path, method, _ in OPERATIONS} == served


@pytest.mark.parametrize("path, method, operation", OPERATIONS, ids=OPERATION_IDS)
def test_each_operation_names_the_one_scope_its_view_requires(app, path, method, operation):
    flask_path = re.sub(r"{(\w+)}", r"<\1>", path)
    rule = next(rule for rule in app.url_map.iter_rules()
                if rule.rule == flask_path and method.upper() in rule.methods)
    scope = app.view_functions[rule.endpoint].required_scope
    assert operation["security"] == [{"apiKey": [scope]}]
    assert f"Scope: **`{scope}`**" in operation["description"]


@pytest.mark.parametrize("path, method, operation", OPERATIONS, ids=OPERATION_IDS)
def test_every_operation_documents_auth_rate_limit_and_outage(path, method, operation):
    assert {"401", "414", "429", "503"} <= statuses(operation)
    success = next(status for status in statuses(operation) if status.startswith("2"))
    assert {"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "RateLimit-Policy",
            "RateLimit"} <= set(operation["responses"][success]["headers"])


@pytest.mark.parametrize("path, method, operation",
                         [op for op in OPERATIONS if "requestBody" in op[2]],
                         ids=[i for i, op in zip(OPERATION_IDS, OPERATIONS) if "requestBody" in op[2]])
def test_bodies_are_closed_and_their_errors_documented(path, method, operation):
    schema = resolve(operation["requestBody"]["content"]["application/json"]["schema"])
    assert schema["additionalProperties"] is False
    assert {"400", "413", "422"} <= statuses(operation)


def test_rate_limited_and_unavailable_answers_carry_retry_after():
    for name in ("RateLimited", "ServiceUnavailable"):
        response = DOCUMENT["components"]["responses"][name]
        assert resolve(response["headers"]["Retry-After"])["required"] is True
        assert "application/problem+json" in response["content"]


def test_create_documents_location_and_list_parameters_their_bounds():
    created = DOCUMENT["paths"][f"{API}/webhooks"]["post"]["responses"]["201"]
    assert created["headers"]["Location"]["required"] is True
    limit = DOCUMENT["components"]["parameters"]["limit"]["schema"]
    assert (limit["minimum"], limit["maximum"], limit["default"]) == (1, 100, 20)


def test_webhook_section_describes_the_ping_delivery():
    ping = DOCUMENT["webhooks"]["vc.test.ping"]["post"]
    headers = {parameter["name"]: parameter for parameter in ping["parameters"]}
    assert set(WEBHOOK_HEADERS) <= set(headers)
    assert all(headers[name]["required"] for name in WEBHOOK_HEADERS)
    assert "MILLISECONDS" in headers["X-VC-Timestamp"]["description"]
    assert "MILLISECONDS" in ping["description"]
    envelope = resolve(ping["requestBody"]["content"]["application/json"]["schema"])
    assert envelope["required"] == ["event", "id", "subscription_id", "occurred_at", "data"]
    assert {"2XX", "401"} <= statuses(ping)


# --- the contract hook -----------------------------------------------------------------------------

def test_the_suite_client_checks_responses_against_the_document(client):
    assert isinstance(client, ContractClient)


def test_a_response_that_drifts_from_the_document_is_caught(app, auth):
    response = FlaskClient(app).get(f"{API}/me", headers=auth)  # a client without the hook
    check_response(response)
    response.set_data(response.get_data().replace(b'"key_id"', b'"keyId"'))
    with pytest.raises(AssertionError, match="breaks openapi.yaml"):
        check_response(response)


def test_paths_the_document_does_not_describe_are_not_checked(client):
    assert client.get("/no/such/path").status_code == 404
    assert client.put(f"{API}/me").status_code == 405


# --- /docs: a page rendered from the document, every asset served here -----------------------------

def test_docs_page_loads_only_this_service_s_assets(client):
    response = client.get("/docs")
    assert response.status_code == 200
    assert response.mimetype == "text/html"
    page = response.get_data(as_text=True)
    sources = re.findall(r'(?:src|href)="([^"]+)"', page)
    assert sources and all(source.startswith("/docs/") for source in sources)
    assert "default-src 'self'" in response.headers["Content-Security-Policy"]
    for source in sources:
        asset = client.get(source)
        assert asset.status_code == 200, source
        assert asset.get_data(), source


def test_docs_script_points_swagger_ui_at_the_document(client):
    script = client.get("/docs/init.js").get_data(as_text=True)
    assert 'url: "/openapi.json"' in script
    assert "validatorUrl: null" in script  # else Swagger UI fetches a badge from a public validator


@pytest.mark.parametrize("name", ["swagger-editor-bundle.js", "..%2Fopenapi.yaml", "index.html"])
def test_only_the_listed_swagger_assets_are_served(client, name):
    assert client.get(f"/docs/assets/{name}").status_code == 404


@pytest.mark.config(AUTH_FAILURE_RATE_LIMIT=1)
@pytest.mark.parametrize("path", ["/openapi.json", "/docs", "/docs/init.js"])
def test_docs_need_no_key_and_are_never_rate_limited(client, path):
    client.get(f"{API}/me")  # spends this address's one failed authentication
    for _ in range(3):
        response = client.get(path, headers={"Authorization": "Bearer wrong"})
        assert response.status_code == 200
        assert "X-RateLimit-Limit" not in response.headers
