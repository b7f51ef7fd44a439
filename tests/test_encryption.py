"""Webhook secrets sealed at rest (docs/data.md): never stored in plaintext, the partner's `whsec_…`
keeps verifying before and after a key rotation, a stored secret under a key no configured key has
is refused at start-up, and the key file used on SQLite when no key is configured."""

import base64
import multiprocessing
import multiprocessing.synchronize
import os
import stat

import pytest

import signing
from tests.support import started_app
from models import Event, Subscription, db
from partner import resealing, sealing
from partner.resealing import check_stored_keys
from partner.subscriptions import secret_of
from partner.errors import StartRefused
from tests.support import ENCRYPTION_KEYS, NEW_ENCRYPTION_KEY, assert_unavailable, ping_as
from tests.test_migrations import assert_no_plaintext_secret

pytestmark = [pytest.mark.both_databases, pytest.mark.config(WEBHOOK_ALLOWED_NETWORKS=["127.0.0.0/8"])]

OLD = ENCRYPTION_KEYS[0]
NEW = NEW_ENCRYPTION_KEY
WEBHOOKS = "/api/v1/partner/webhooks"


def key_id(key: str) -> str:
    return sealing.key_id(sealing.decode_key(key))


@pytest.fixture
def start(config):
    """create_app on the test's database with these keys (a restart with a new setting)."""
    def start(keys):
        return started_app({**config, "ENCRYPTION_KEYS": keys})
    return start


def subscribe_and_deliver(app, auth, url, subscription=None) -> dict:
    """Create a subscription (unless given), trigger a ping with its secret, deliver it; the request."""
    client = app.test_client()
    if subscription is None:
        subscription = client.post(WEBHOOKS, json={"url": url}, headers=auth).get_json()
    response = client.post(f"{WEBHOOKS}/{subscription['id']}/test", json={"secret": subscription["secret"]},
                           headers=auth)
    assert response.status_code == 202  # the test trigger's constant-time compare opens the sealed secret
    assert app.extensions["delivery"].run_due() == 1
    return subscription


def test_deliveries_verify_with_the_original_secret_before_and_after_a_rotation(
        app, start, auth, receiver, clock, database_url):
    subscription = subscribe_and_deliver(app, auth, receiver.url)
    restarted = start([NEW, OLD])  # the new key first: it seals; the old one still opens
    runner = restarted.test_cli_runner()
    rotated = runner.invoke(args=["encryption", "rotate"])
    assert rotated.exit_code == 0, rotated.output
    assert f"Re-sealed 1 webhook secrets under key id {key_id(NEW)}" in rotated.output
    only_new = start([NEW])  # the old key removed
    subscribe_and_deliver(only_new, auth, receiver.url, subscription)
    assert len(receiver.received) == 2
    for request in receiver.received:
        signing.verify(request.headers, request.body, subscription["secret"], now_ms=int(clock() * 1000))
    with db.connection_context():
        assert {s.secret_key_id for s in Subscription.select()} == {key_id(NEW)}
    assert_no_plaintext_secret(database_url)


def damage_first_secret(client, auth, count: int) -> tuple[str, list[str]]:
    """`count` subscriptions, the first in id order (so in a rotation's first batch) with a secret
    that no longer opens; its id and the others'."""
    ids = sorted(client.post(WEBHOOKS, json={"url": f"https://hooks.partner.example/{n}"}, headers=auth)
                 .get_json()["id"] for n in range(count))
    with db.connection_context():
        moved = Subscription.get_by_id(ids[1]).secret_sealed  # sealed for another subscription
        Subscription.update(secret_sealed=moved).where(Subscription.id == ids[0]).execute()
    return ids[0], ids[1:]


def sealed_under(ids: list[str]) -> set[str]:
    with db.connection_context():
        return {s.secret_key_id for s in Subscription.select().where(Subscription.id.in_(ids))}


def test_a_rotation_passes_over_a_damaged_secret_names_it_and_exits_1(app, start, auth, caplog):
    damaged, others = damage_first_secret(app.test_client(), auth, 5)
    rotated = start([NEW, OLD]).test_cli_runner().invoke(args=["encryption", "rotate"])
    assert rotated.exit_code == 1, rotated.output
    assert f"Re-sealed 4 webhook secrets under key id {key_id(NEW)}; 1 skipped: their secrets do not open" \
        in rotated.output
    assert sealed_under(others) == {key_id(NEW)} and sealed_under([damaged]) == {key_id(OLD)}
    [line] = [r for r in caplog.records if damaged in r.getMessage()]
    assert line.levelname == "ERROR" and "does not open" in line.getMessage()


def test_a_rotation_in_small_batches_gets_past_a_damaged_secret(app, start, auth):
    damaged, others = damage_first_secret(app.test_client(), auth, 4)
    with start([NEW, OLD]).app_context(), db.connection_context():
        assert resealing.rotate(batch=1) == resealing.Rotated(resealed=3, key_id=key_id(NEW), skipped=1)
    assert sealed_under(others) == {key_id(NEW)}


def test_a_secret_under_a_key_no_longer_configured_is_refused_at_start_up(app, start, auth, caplog):
    app.test_client().post(WEBHOOKS, json={"url": "https://hooks.partner.example/x"}, headers=auth)
    with pytest.raises(StartRefused, match=f"key id {key_id(OLD)}"):
        start([NEW])
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 1 and key_id(OLD) in refusals[0]


def test_a_ping_to_a_process_without_the_new_key_is_503_during_a_rotation(app, client, start, auth, caplog):
    """The runbook's rolling restart: a restarted process seals a new subscription under the new key,
    and one not yet restarted (`app`, started with the old key alone) cannot open it. Its test trigger
    answers 503 to retry (another process, or this one restarted, can), logs the key id, and queues
    nothing; it was a 500."""
    subscription = start([NEW, OLD]).test_client().post(
        WEBHOOKS, json={"url": "https://hooks.partner.example/x"}, headers=auth).get_json()
    sealing.use(sealing.keyring_of([OLD]))  # back in the process not restarted (one keyring per process)
    assert_unavailable(ping_as(client, auth, subscription))
    with db.connection_context():
        assert Event.select().count() == 0
    assert [r.levelname for r in caplog.records if f"key id {key_id(NEW)}" in r.getMessage()] == ["ERROR"]
    assert subscription["secret"] not in caplog.text


def test_a_ping_to_a_secret_damaged_at_rest_is_a_503_too_never_a_500(client, auth, caplog):
    first, second = (client.post(WEBHOOKS, json={"url": "https://hooks.partner.example/"}, headers=auth)
                     .get_json() for _ in range(2))
    with db.connection_context():
        moved = Subscription.get_by_id(first["id"]).secret_sealed
        Subscription.update(secret_sealed=moved).where(Subscription.id == second["id"]).execute()
    assert_unavailable(ping_as(client, auth, second))
    assert [r.levelname for r in caplog.records if f"secret of {second['id']} does not open" in r.getMessage()] == [
        "ERROR"]


def test_no_secret_is_stored_in_plaintext(app, auth, database_url):
    client = app.test_client()
    for n in range(5):
        client.post(WEBHOOKS, json={"url": f"https://hooks.partner.example/{n}"}, headers=auth)
    assert_no_plaintext_secret(database_url)


def test_a_sealed_secret_moved_onto_another_subscription_does_not_open(app, auth):
    client = app.test_client()
    first, second = (client.post(WEBHOOKS, json={"url": "https://hooks.partner.example/"}, headers=auth)
                     .get_json()["id"] for _ in range(2))
    with db.connection_context():
        stolen = Subscription.get_by_id(first)
        Subscription.update(secret_sealed=stolen.secret_sealed).where(Subscription.id == second).execute()
        with pytest.raises(sealing.SealingError):
            secret_of(Subscription.get_by_id(second))


@pytest.mark.parametrize("sealed", [b"", b"\0" * 5])
def test_a_sealed_secret_cut_short_does_not_open(sealed):
    ring = sealing.keyring_of([sealing.new_key()])
    with pytest.raises(sealing.SealingError):
        ring.open("wh_cut", ring.sealing_id, sealed)


def test_new_key_prints_32_random_bytes_base64url(app):
    keys = {app.test_cli_runner().invoke(args=["encryption", "new-key"]).stdout.splitlines()[-1]
            for _ in range(2)}
    assert len(keys) == 2
    for key in keys:
        assert "=" not in key and len(base64.urlsafe_b64decode(key + "=")) == 32


@pytest.mark.parametrize("keys", ['["short"]', "[]", "not json", '"a string"', "[1]"])
def test_an_unusable_key_setting_is_refused_at_start_up(start, keys):
    with pytest.raises(StartRefused, match="PARTNER_ENCRYPTION_KEYS"):
        start(keys)


def test_without_keys_sqlite_uses_a_key_file_made_once_with_mode_0600(config, tmp_path, backend, caplog):
    if backend != "sqlite":
        with pytest.raises(StartRefused, match="PARTNER_ENCRYPTION_KEYS is not set"):
            started_app({**config, "ENCRYPTION_KEYS": None})
        return
    key_file = tmp_path / "instance" / "encryption.key"
    settings = {**config, "ENCRYPTION_KEYS": None, "ENCRYPTION_KEY_FILE": str(key_file)}
    started_app(settings)
    started_app(settings)  # the second start reads the same file
    assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
    warnings = [r for r in caplog.records if "PARTNER_ENCRYPTION_KEYS is not set" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelname == "WARNING"
    with db.connection_context():
        check_stored_keys(db.obj)  # the file's key is the one in use


def _load_key_file(path: str, start: multiprocessing.synchronize.Barrier, keys: multiprocessing.Queue) -> None:
    start.wait()
    keys.put(sealing.load_keyring(None, path, True).sealing_id)


@pytest.mark.servers  # service processes starting together
def test_services_starting_together_make_one_key_file_and_all_use_it(tmp_path):
    """Four processes at the first start, twenty times: each must read the whole key the first one made."""
    forked = multiprocessing.get_context("fork")
    for round_ in range(20):
        path, start, keys = str(tmp_path / str(round_) / "encryption.key"), forked.Barrier(4), forked.Queue()
        processes = [forked.Process(target=_load_key_file, args=(path, start, keys)) for _ in range(4)]
        for process in processes:
            process.start()
        for process in processes:
            process.join(timeout=30)
        assert [process.exitcode for process in processes] == [0] * 4
        assert len({keys.get(timeout=5) for _ in processes}) == 1
        assert os.listdir(os.path.dirname(path)) == ["encryption.key"]
