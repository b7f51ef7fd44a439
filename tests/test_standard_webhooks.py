"""Receivers verify us with the outside world's own tools (STYLE 23): a real delivery to loopback,
verified by the standardwebhooks libraries of PyPI (requirements-dev.txt) and npm
(tests/node/package-lock.json) with the secret exactly as the create response returned it, and by
Stripe's verifier for X-VC-Signature; secrets issued before release 1.4 keep working."""

import base64
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import standardwebhooks
import stripe

import signing
from models import Subscription, db
from partner.subscriptions import new_secret
from tests.support import lead, sealed

NODE = Path(__file__).parent / "node"
# What token_urlsafe(32) gave before 1.4: base64url, unpadded; the bytes e0..ff, with "-" and "_",
# and 00..1f, without (about one old secret in four has neither).
OLD_SECRET = "whsec_4OHi4-Tl5ufo6err7O3u7_Dx8vP09fb3-Pn6-_z9_v8"
OLD_PLAIN_SECRET = "whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8"


class Refused(Exception):
    """A library refused a delivery; the message is the library's."""


@pytest.fixture
def config(config):
    config.setdefault("WEBHOOK_ALLOWED_NETWORKS", ["127.0.0.0/8"])
    return config


@pytest.fixture(scope="session")
def npm_library() -> None:
    """tests/node/node_modules as its package-lock.json pins it: `npm ci`, again whenever the lock changes."""
    if not (shutil.which("node") and shutil.which("npm")):
        pytest.fail("node and npm are required: run `bash scripts/test-services.sh`", pytrace=False)
    lock = (NODE / "package-lock.json").read_bytes()
    installed = NODE / "node_modules" / ".installed-lock"
    if not installed.is_file() or installed.read_bytes() != lock:
        subprocess.run(["npm", "ci", "--silent", "--no-audit", "--no-fund"], cwd=NODE, check=True, timeout=600)
        installed.write_bytes(lock)


def pypi_verify(secret: str | bytes, request) -> None:
    """The PyPI library's check; a bytes secret is the key itself."""
    try:
        standardwebhooks.Webhook(secret).verify(request.body, request.headers)
    except standardwebhooks.WebhookVerificationError as error:
        raise Refused(str(error)) from error


def npm_verify(secret: str, request, raw_key: bool = False) -> None:
    """The npm library's check (tests/node/verify.js; with raw_key, the docs' way for an old secret)."""
    given = {"secret": secret, "raw_key": raw_key, "headers": request.headers,
             "body": base64.b64encode(request.body).decode()}
    answer = subprocess.run(["node", str(NODE / "verify.js")], input=json.dumps(given), capture_output=True,
                            text=True, timeout=60)
    if answer.returncode:
        raise Refused(answer.stderr.strip())


@pytest.fixture(params=["pypi", "npm"])
def library(request):
    """A Standard Webhooks library's verifier: library(secret, request) returns, or raises Refused."""
    if request.param == "npm":
        request.getfixturevalue("npm_library")
        return npm_verify
    return pypi_verify


@pytest.fixture(params=["ping", "published"])
def delivered(request, dispatcher, receiver, subscribe, ping, clock):
    """delivered(seconds_ago=0): a new subscription's test ping, or a published event, delivered for
    real, with the service's clock that far behind the wall clock; (its secret as created, the request
    as it arrived)."""
    def deliver(seconds_ago: float = 0):
        publish = request.getfixturevalue("publish") if request.param == "published" else None
        clock.advance(-seconds_ago)
        subscription = subscribe(receiver.url)
        if publish is None:
            ping(subscription)
        else:
            assert publish(lead()).status_code == 202
        assert dispatcher.run_due() == 1
        return subscription["secret"], receiver.received[-1]
    return deliver


@pytest.fixture
def delivered_under(app, dispatcher, receiver, subscribe, ping):
    """delivered_under(secret): the request of a test ping to a subscription given that secret, as one
    issued before 1.4 is."""
    def deliver(secret: str):
        subscription = subscribe(receiver.url)
        with app.app_context(), db.connection_context():
            Subscription.update(**sealed(subscription["id"], secret)).where(Subscription.id == subscription["id"]).execute()
        ping({**subscription, "secret": secret})
        assert dispatcher.run_due() == 1
        return receiver.received[-1]
    return deliver


def test_the_library_verifies_a_delivery_with_the_secret_as_created(library, delivered):
    library(*delivered())


def test_the_library_refuses_a_wrong_secret(library, delivered):
    _, request = delivered()
    with pytest.raises(Refused, match="No matching signature"):
        library(new_secret(), request)


def test_the_library_refuses_a_delivery_signed_ten_minutes_ago(library, delivered):
    with pytest.raises(Refused, match="too old"):
        library(*delivered(seconds_ago=600))


def test_an_old_secret_still_verifies_x_vc_signature_here_and_with_stripe(delivered_under, clock):
    request = delivered_under(OLD_SECRET)
    assert signing.verify(request.headers, request.body, OLD_SECRET, now_ms=int(clock() * 1000)) == request.body
    # Stripe's scheme is ours in seconds: t=<timestamp>,v1=<hex> over "<t>.<body>"; no tolerance
    # (ours is in ms, checked just above), so only the HMAC is Stripe's to judge.
    header = f"t={request.headers['X-VC-Timestamp']},v1={request.headers['X-VC-Signature'].removeprefix('sha256=')}"
    assert stripe.WebhookSignature.verify_header(request.body, header, OLD_SECRET) is True
    with pytest.raises(stripe.SignatureVerificationError):
        stripe.WebhookSignature.verify_header(request.body, header, new_secret())


def test_an_old_secret_verifies_webhook_signature_by_its_base64url_key(delivered_under, clock, npm_library):
    request = delivered_under(OLD_SECRET)
    signing.verify_standard(request.headers, request.body, OLD_SECRET, now_s=int(clock()))
    # As docs/webhooks.md says: both libraries refuse the string, and take its base64url decoding.
    with pytest.raises(ValueError):  # the PyPI library drops "-" and "_", here leaving invalid base64
        pypi_verify(OLD_SECRET, request)
    with pytest.raises(Refused, match="incorrect characters"):
        npm_verify(OLD_SECRET, request)
    pypi_verify(base64.urlsafe_b64decode(OLD_SECRET.removeprefix("whsec_") + "="), request)
    npm_verify(OLD_SECRET, request, raw_key=True)


def test_an_old_secret_without_dash_or_underscore_works_in_the_libraries_unchanged(library, delivered_under):
    library(OLD_PLAIN_SECRET, delivered_under(OLD_PLAIN_SECRET))
