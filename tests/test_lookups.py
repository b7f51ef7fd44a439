"""lookups.py: DNS answers within a time limit, on threads of their own, through the resolver seam."""

import threading
import time

import pytest

from partner.outbound.dns import Lookups
from tests.support import SLACK_SECONDS, StubResolver, eventually


@pytest.fixture
def resolver():
    resolver = StubResolver({"hooks.partner.example": ["93.184.215.14"]})
    yield resolver
    resolver.released.set()


def test_an_answer_in_time_is_returned(resolver):
    assert Lookups(resolver).resolve("hooks.partner.example", 1) == ["93.184.215.14"]


def test_the_resolvers_own_failure_reaches_the_caller():
    def broken(host):
        raise OSError("no such name")

    with pytest.raises(OSError, match="no such name"):
        Lookups(broken).resolve("nowhere.partner.example", 1)


def test_no_answer_in_time_is_a_timeout_after_that_time(resolver):
    resolver.stalled.add("hooks.partner.example")
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        Lookups(resolver).within(0.3)("hooks.partner.example")
    assert 0.3 <= time.monotonic() - started < 0.3 + SLACK_SECONDS  # stalled until the test ends


def test_a_stalled_name_does_not_hold_up_other_names(resolver):
    resolver.answers["other.partner.example"] = ["93.184.215.15"]
    resolver.stalled.add("hooks.partner.example")
    lookups = Lookups(resolver, threads=2)
    with pytest.raises(TimeoutError):
        lookups.resolve("hooks.partner.example", 0.1)
    assert lookups.resolve("other.partner.example", 1) == ["93.184.215.15"]


def test_lookups_of_a_name_already_under_way_share_it(resolver):
    resolver.stalled.add("hooks.partner.example")
    lookups = Lookups(resolver)
    asked, lookup = [], lookups._lookup

    def asking(host):  # each caller's look for a lookup under way, seen once it has its answer's future
        future = lookup(host)
        asked.append(host)
        return future
    lookups._lookup = asking
    waiting = [threading.Thread(target=lookups.resolve, args=("hooks.partner.example", 30)) for _ in range(5)]
    for thread in waiting:
        thread.start()
    assert eventually(lambda: len(asked) == 5)
    resolver.released.set()
    for thread in waiting:
        thread.join()
    assert resolver.lookups == ["hooks.partner.example"]


def test_a_finished_lookup_is_not_reused_later(resolver):
    lookups = Lookups(resolver)
    lookups.resolve("hooks.partner.example", 1)
    lookups.resolve("hooks.partner.example", 1)
    assert resolver.lookups == ["hooks.partner.example"] * 2


def test_creating_lookups_starts_no_thread(resolver):
    before = threading.active_count()
    Lookups(resolver)
    assert threading.active_count() == before
