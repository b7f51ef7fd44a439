"""No key secret and no webhook secret ever reaches a log record, at any level, from any logger."""

import base64
import logging

import pytest

from tests.support import started_app
from partner.keys import parse_key
from tests.support import ME, WEBHOOKS, bearer

HOOK_URL = "https://hooks.partner.example/hook"
# Named explicitly so they are at DEBUG and propagating even before anything has created them.
LIBRARY_LOGGERS = ("werkzeug", "peewee", "flask_limiter", "limits", "urllib3", "requests",
                   "apscheduler", "flask.app", "app", "partner.edge.problems")


@pytest.fixture
def debug_logging(caplog):
    """Root and every known logger at DEBUG, enabled and propagating to caplog; restored afterwards."""
    caplog.set_level(logging.DEBUG)
    saved = []
    for name in sorted(set(logging.root.manager.loggerDict) | set(LIBRARY_LOGGERS)):
        logger = logging.getLogger(name)
        saved.append((logger, logger.propagate, logger.disabled))
        caplog.set_level(logging.DEBUG, logger=name)
        logger.propagate, logger.disabled = True, False
    yield caplog
    for logger, propagate, disabled in saved:
        logger.propagate, logger.disabled = propagate, disabled


@pytest.fixture
def config(config):
    config["WEBHOOK_ALLOWED_NETWORKS"] = ["127.0.0.0/8"]  # deliveries go to a receiver on loopback
    return config


@pytest.fixture
def recovering_receiver(start_receiver):
    """Fails once (500), then answers 200."""
    return start_receiver(script=[500, 200])


@pytest.fixture
def app(config, debug_logging):
    """The app built after logging is at DEBUG, so start-up (schema, config warnings) is captured too."""
    return started_app(config)


@pytest.fixture
def flask_keys(app):
    runner = app.test_cli_runner()

    def invoke(*args):
        result = runner.invoke(args=["keys", *args])
        assert result.exit_code == 0, result.output
        return result
    return invoke


@pytest.fixture
def scenario_tools(recovering_receiver, app, clock):
    return recovering_receiver, app.extensions["delivery"], clock


def last_line(result) -> str:
    return result.stdout.strip().splitlines()[-1]


def fragments(secret: str) -> set[str]:
    """The secret and its two ends, so a truncated or slightly altered secret is caught too."""
    return {secret, secret[:12], secret[-12:]}


def record_text(record: logging.LogRecord) -> str:
    """Everything a handler could write from a record: message, raw msg/args, extras, traceback."""
    parts = [record.getMessage(), repr(vars(record)), record.exc_text or "", record.stack_info or ""]
    if record.exc_info:
        parts.append(logging.Formatter().formatException(record.exc_info))
    return "\n".join(parts)


def leaks(texts, secrets) -> list[str]:
    return sorted({fragment for text in texts for secret in secrets for fragment in fragments(secret)
                   if fragment in text})


def exercise_every_path(client, flask_keys, recovering_receiver, dispatcher, clock) -> dict:
    """Issue keys through the CLI and send them down every success and error path we have."""
    key = last_line(flask_keys("create", "--org", "acme", "--scope", "webhooks:manage"))
    slow = last_line(flask_keys("create", "--org", "slow", "--rate-limit", "2"))
    revoked = last_line(flask_keys("create", "--org", "gone"))
    flask_keys("revoke", parse_key(revoked)[0])
    rotated_away = last_line(flask_keys("create", "--org", "acme", "--scope", "webhooks:manage"))
    rotated = last_line(flask_keys("rotate", parse_key(rotated_away)[0]))
    cli_output = [flask_keys("list").output, flask_keys("list", "--org", "acme").output]

    key_id, secret = parse_key(key)
    wrong_secret = f"vck_{key_id}.{'A' if secret[0] != 'A' else 'B'}{secret[1:]}"
    responses = []

    def send(method, path, expected, **kwargs):
        response = client.open(path, method=method, **kwargs)
        assert response.status_code == expected, (method, path, response.get_data(as_text=True))
        responses.append(response)
        return response

    # Successful calls, in every accepted spelling.
    for headers in (bearer(key), {"Authorization": key}, {"Authorization": f"bearer  {key}"}, bearer(rotated)):
        send("GET", ME, 200, headers=headers)
    # One indistinguishable 401 for everything else that carries a secret.
    for bad in (revoked, rotated_away, wrong_secret, f"vck_{'Z' * 20}.{secret}", f"{key}x", f"{key}\u00e9",
                f"{key} {key}", f"Token {key}", f"Basic {key}",
                "Basic " + base64.b64encode(f"{key}:".encode()).decode(),
                "Basic " + base64.b64encode(f"partner:{key}".encode()).decode()):
        send("GET", ME, 401, headers={"Authorization": bad})
    # A key in a query string, with and without a valid header.
    send("GET", ME, 401, query_string={"api_key": key})
    send("GET", ME, 200, query_string={"api_key": key, "secret": secret}, headers=bearer(key))
    # A key in a JSON body: an unknown field, and no credentials at all.
    send("POST", WEBHOOKS, 422, json={"url": HOOK_URL, "api_key": key}, headers=bearer(key))
    send("POST", WEBHOOKS, 401, json={"url": HOOK_URL, "api_key": key})
    # The framework's error paths, each with the key in the header and in the request.
    send("GET", f"/api/v1/partner/keys/{key}", 404, headers=bearer(key))
    send("DELETE", f"{WEBHOOKS}/wh_none", 404, headers=bearer(key), json={"secret": secret})
    send("DELETE", ME, 405, headers=bearer(key), data=key)
    send("PUT", WEBHOOKS, 405, headers=bearer(key), json={"api_key": key})
    send("POST", WEBHOOKS, 413, headers=bearer(key), data='{"url": "' + key * 1000 + '"}',
         content_type="application/json")
    send("POST", WEBHOOKS, 400, headers=bearer(key), data='{"url": "' + key, content_type="application/json")
    send("GET", WEBHOOKS, 422, headers=bearer(key), query_string={"limit": key})

    # Webhooks: the whsec_ secret exists in the create response only.
    created = send("POST", WEBHOOKS, 201, headers=bearer(key), json={"url": recovering_receiver.url, "description": "d"})
    hook = created.get_json()
    doomed_created = send("POST", WEBHOOKS, 201, headers=bearer(key), json={"url": HOOK_URL})
    doomed = doomed_created.get_json()
    send("GET", WEBHOOKS, 200, headers=bearer(key))
    # The test trigger carries the webhook secret in its body: right, wrong, and beside an unknown field.
    wrong_hook_secret = hook["secret"][:-1] + ("A" if hook["secret"][-1] != "A" else "B")
    trigger = f"{WEBHOOKS}/{hook['id']}/test"
    send("POST", trigger, 202, headers=bearer(key), json={"secret": hook["secret"]})
    send("POST", trigger, 403, headers=bearer(key), json={"secret": wrong_hook_secret})
    send("POST", trigger, 422, headers=bearer(key), json={"secret": hook["secret"], "key": key})
    # The ping is signed with the secret and delivered: a failed attempt (500), then a retry that succeeds.
    assert dispatcher.run_due() == 1
    clock.advance(3600)
    assert dispatcher.run_due() == 1
    assert [r.headers["X-VC-Attempt"] for r in recovering_receiver.received] == ["1", "2"]
    send("GET", f"{WEBHOOKS}/{hook['id']}/failures", 200, headers=bearer(key))
    send("DELETE", f"{WEBHOOKS}/{doomed['id']}", 204, headers=bearer(key))

    # The organization's budget (2 a minute), then the failed-login budget of the client address.
    send("GET", ME, 200, headers=bearer(slow))
    send("GET", ME, 200, headers=bearer(slow))
    send("GET", ME, 429, headers=bearer(slow), query_string={"api_key": slow})
    for _ in range(100):
        response = client.get(ME, headers=bearer(wrong_secret))
        responses.append(response)
        if response.status_code == 429:
            break
    assert responses[-1].status_code == 429

    full_keys = [key, slow, revoked, rotated_away, rotated]
    return {"key_secrets": full_keys + [parse_key(full)[1] for full in full_keys], "webhook_secrets": [hook["secret"], doomed["secret"]],
            "responses": responses, "created": [created, doomed_created], "cli_output": cli_output}


def test_no_key_or_webhook_secret_is_logged_at_any_level(client, flask_keys, scenario_tools, debug_logging,
                                                         capfd):
    seen = exercise_every_path(client, flask_keys, *scenario_tools)
    records = debug_logging.records
    assert any(r.name == "peewee" for r in records), "peewee's SQL log was not captured at DEBUG"

    # Key secrets: nowhere at all, peewee's SQL log included (it may show the hash, never the secret).
    assert leaks([debug_logging.text], seen["key_secrets"]) == []
    assert leaks(map(record_text, records), seen["key_secrets"]) == []
    # Webhook secrets: no application or framework log. (peewee's SQL log: see the next test.)
    app_records = [r for r in records if r.name != "peewee"]
    assert leaks(map(record_text, app_records), seen["webhook_secrets"]) == []
    # Nor anything written straight to stdout/stderr instead of through logging.
    out, err = capfd.readouterr()
    assert leaks([out, err], seen["key_secrets"] + seen["webhook_secrets"]) == []


def test_no_secret_is_echoed_in_responses_or_the_key_list(client, flask_keys, scenario_tools):
    seen = exercise_every_path(client, flask_keys, *scenario_tools)
    all_secrets = seen["key_secrets"] + seen["webhook_secrets"]
    bodies = [r.get_data(as_text=True) + str(r.headers) for r in seen["responses"]
              if r not in seen["created"]]
    assert leaks(bodies, all_secrets) == []
    assert leaks(seen["cli_output"], all_secrets) == []


def test_webhook_secret_is_not_in_peewee_sql_debug_log(client, issue_key, debug_logging):
    key = issue_key()
    secret = client.post(WEBHOOKS, headers=bearer(key), json={"url": HOOK_URL}).get_json()["secret"]
    peewee_records = [r for r in debug_logging.records if r.name == "peewee"]
    assert peewee_records, "peewee's SQL log was not captured at DEBUG"
    assert leaks(map(record_text, peewee_records), [secret]) == []


def test_no_record_that_holds_a_secret_shows_it_in_its_repr(app, client, clock):
    from models import ApiKey, Subscription, db
    from partner.keys import create_key
    from partner.outbox import claim_due
    with app.app_context(), db.connection_context():
        issued = create_key("acme", ["webhooks:manage"], int(clock() * 1000))
    hook = client.post(WEBHOOKS, headers=bearer(issued.full_key), json={"url": HOOK_URL}).get_json()
    client.post(f"{WEBHOOKS}/{hook['id']}/test", headers=bearer(issued.full_key),
                json={"secret": hook["secret"]})
    with app.app_context(), db.connection_context():
        claims = claim_due(int(clock() * 1000) + 1, limit=10, lease_ms=60_000)
        records = [issued, claims, Subscription.get_by_id(hook["id"]), ApiKey.get()]
        shown = [repr(record) for record in records]
    assert len(claims) == 1 and claims[0].secret == hook["secret"]
    assert leaks(shown, [issued.full_key, parse_key(issued.full_key)[1], hook["secret"]]) == []
    assert repr(records[2]) == f"<Subscription: {hook['id']}>"  # peewee shows the primary key only
