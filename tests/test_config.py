"""config.py: PARTNER_DELIVERY_CA_BUNDLE and PARTNER_TRUSTED_PROXIES are checked at start-up, like every
other setting."""

import re
import time

import pytest

from app import create_app
from tests.support import open_database, started_app
from partner.config import separate_budgets
from partner.errors import StartRefused
from partner.outbound import ssrf
from tests.gunicorn_server import run_flask


def test_the_default_trust_store_needs_no_bundle(config):
    assert create_app(config).config["DELIVERY_CA_BUNDLE"] == ""


def test_a_bundle_is_loaded_at_start_up(config, ca_bundle):
    app = create_app({**config, "DELIVERY_CA_BUNDLE": ca_bundle})
    assert app.extensions["delivery"].courier.sender.transport.tls.get_ca_certs() != []


@pytest.mark.parametrize("bundle", ["/nonexistent/ca.pem", 42, ["/etc/ssl/certs"]])
def test_a_bundle_that_is_not_a_file_stops_start_up(config, bundle):
    with pytest.raises(StartRefused, match="PARTNER_DELIVERY_CA_BUNDLE"):
        create_app({**config, "DELIVERY_CA_BUNDLE": bundle})


def test_a_bundle_without_certificates_stops_start_up(config, tmp_path):
    not_pem = tmp_path / "ca.pem"
    not_pem.write_text("not a certificate\n")
    with pytest.raises(StartRefused, match="PARTNER_DELIVERY_CA_BUNDLE"):
        started_app({**config, "DELIVERY_CA_BUNDLE": str(not_pem)})


def test_the_clock_and_the_resolver_are_never_read_from_the_environment(monkeypatch, database_url):
    """They are seams for tests (create_app's overrides), not settings: PARTNER_CLOCK=1 must not
    stop time for a service that happens to have it in its environment."""
    monkeypatch.setenv("PARTNER_CLOCK", "1")
    monkeypatch.setenv("PARTNER_RESOLVER", '"8.8.8.8"')
    config = create_app({"DATABASE_URL": database_url}).config
    assert (config["CLOCK"], config["RESOLVER"]) == (time.time, ssrf.system_resolver)


@pytest.mark.parametrize("hops", ["0", "2"])
def test_trusted_proxies_is_a_number_of_hops(config, monkeypatch, hops):
    monkeypatch.setenv("PARTNER_TRUSTED_PROXIES", hops)
    assert create_app(config).config["TRUSTED_PROXIES"] == int(hops)


@pytest.mark.parametrize("hops", ["-1", "1.5", '"1"', "true", "[1]"])
def test_trusted_proxies_that_is_not_a_whole_number_of_hops_stops_start_up(config, monkeypatch, hops):
    monkeypatch.setenv("PARTNER_TRUSTED_PROXIES", hops)
    with pytest.raises(StartRefused, match="PARTNER_TRUSTED_PROXIES"):
        create_app(config)


@pytest.mark.parametrize("addresses, named", [('"127.0.0.1/32"', "'127.0.0.1/32'"),
                                               ('["127.0.0.1/8"]', "'127.0.0.1/8'"), ('["proxy"]', "'proxy'")])
def test_trusted_proxy_addresses_that_are_not_networks_stop_start_up_naming_the_entry(config, monkeypatch,
                                                                                      addresses, named):
    monkeypatch.setenv("PARTNER_TRUSTED_PROXY_ADDRESSES", addresses)
    with pytest.raises(StartRefused, match=re.escape(f"PARTNER_TRUSTED_PROXY_ADDRESSES: ") + ".*" + re.escape(named)):
        create_app(config)


@pytest.mark.parametrize("uri, workers, warned", [("memory://", 2, True), ("memory://", 1, False),
                                                  ("redis://127.0.0.1:6379/0", 4, False)])
def test_separate_in_memory_budgets_are_announced(uri, workers, warned):
    warning = separate_budgets(uri, workers)
    assert bool(warning) is warned
    if warned:
        assert f"{workers} times its limit" in warning and "PARTNER_RATELIMIT_STORAGE_URI=redis://" in warning


def test_a_retention_longer_than_a_century_stops_start_up(config):
    with pytest.raises(StartRefused, match="PARTNER_RETENTION_DAYS must be at most 36500"):
        create_app({**config, "RETENTION_DAYS": 999_999_999})


@pytest.mark.parametrize("name, value", [("TRUSTED_PROXIES", "-1"), ("DELIVERY_TIMEOUT", "0"),
                                         ("DATABASE_URL", "nonsense"), ("OPS_PORT", "abc")])
def test_an_operator_command_refuses_a_bad_setting_in_one_line(server_env, name, value):
    result = run_flask({**server_env, f"PARTNER_{name}": value}, "keys", "list")
    assert result.returncode == 1
    assert f"refusing to start: PARTNER_{name} must be" in result.stderr and "Traceback" not in result.stderr, \
        result.stderr


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "partner.config" and r.levelname == "WARNING"]


def test_each_unknown_variable_is_one_warning_naming_the_closest_setting(config, monkeypatch, caplog):
    monkeypatch.setenv("PARTNER_DELIVERY_TIMOUT", "5")
    monkeypatch.setenv("PARTNER_RETRY_DELAYS", "[1]")
    monkeypatch.setenv("PARTNER_ZZZ", "1")
    create_app(config)
    assert warnings_of(caplog) == [
        "PARTNER_DELIVERY_TIMOUT is not a setting of this service and is ignored; did you mean "
        "PARTNER_DELIVERY_TIMEOUT?",
        "PARTNER_RETRY_DELAYS is not a setting of this service and is ignored; did you mean "
        "PARTNER_DELIVERY_RETRY_DELAYS?",
        "PARTNER_ZZZ is not a setting of this service and is ignored (docs/operations.md lists the settings)"]


def test_known_variables_warn_of_nothing_and_seams_say_they_are_ignored(config, monkeypatch, caplog):
    monkeypatch.setenv("PARTNER_DELIVERY_TIMEOUT", "5")
    monkeypatch.setenv("PARTNER_LOG_LEVEL", "WARNING")
    monkeypatch.setenv("PARTNER_CLOCK", "1")
    create_app(config)
    assert warnings_of(caplog) == ["PARTNER_CLOCK is ignored: it is a seam for tests, never read from the environment"]


def test_an_operator_command_warns_of_a_mistyped_variable_once(server_env):
    open_database(server_env["PARTNER_DATABASE_URL"]).close_all()
    result = run_flask({**server_env, "PARTNER_DATABSE_URL": "sqlite:////nowhere"}, "keys", "list")
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("PARTNER_DATABSE_URL") == 1 and "did you mean PARTNER_DATABASE_URL?" in result.stderr


@pytest.mark.parametrize("value", ["0", "-1", "1.5", '"65536"', "true", "[]"])
def test_a_max_content_length_that_is_no_positive_integer_stops_start_up(config, monkeypatch, value):
    monkeypatch.setenv("PARTNER_MAX_CONTENT_LENGTH", value)
    with pytest.raises(StartRefused, match="PARTNER_MAX_CONTENT_LENGTH must be a positive integer"):
        create_app(config)


@pytest.mark.parametrize("value", ["info", "LOUD", "20"])
def test_a_log_level_logging_does_not_know_stops_start_up(config, monkeypatch, value):
    monkeypatch.setenv("PARTNER_LOG_LEVEL", value)
    with pytest.raises(StartRefused, match="PARTNER_LOG_LEVEL must be DEBUG, INFO, WARNING, ERROR, CRITICAL"):
        create_app(config)


@pytest.mark.parametrize("most", [0, -3, 2.5, "16", True])
def test_a_most_per_subscription_that_is_not_a_positive_whole_number_stops_start_up(config, most):
    with pytest.raises(StartRefused, match="PARTNER_DELIVERY_MAX_PER_SUBSCRIPTION must be a positive integer"):
        create_app({**config, "DELIVERY_MAX_PER_SUBSCRIPTION": most})
