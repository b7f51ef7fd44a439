"""dns.py: DNS answers within the caller's deadline, on threads of their own, each tenant within its
bound, through the resolver seam; names in `resolver.stalled` never answer until teardown."""

import threading
import time

import pytest

from partner.outbound.dns import Lookups, LookupsBusy
from partner.outbound.transport import Deadline
from tests.support import SLACK_SECONDS, StubResolver, eventually

ANSWER = ["93.184.215.14"]


@pytest.fixture
def resolver():
    resolver = StubResolver({"hooks.partner.example": ANSWER}, default=ANSWER)
    yield resolver
    resolver.released.set()


def stuck(lookups: Lookups, resolver: StubResolver, tenant: str, *names: str) -> None:
    """Start a lookup of each name for `tenant` and give up on it at once: it stays in flight."""
    for name in names:
        resolver.stalled.add(name)
        with pytest.raises(TimeoutError):
            lookups.resolve(name, tenant, 0)


def refused_at_once(lookups: Lookups, host: str, tenant: str) -> bool:
    started = time.monotonic()
    with pytest.raises(LookupsBusy):
        lookups.resolve(host, tenant, 30)
    return time.monotonic() - started < SLACK_SECONDS  # queued, it would wait its 30 s


def test_an_answer_in_time_is_returned(resolver):
    assert Lookups(resolver).resolve("hooks.partner.example", "acme", 1) == ANSWER


def test_the_resolvers_own_failure_reaches_the_caller():
    def broken(host):
        raise OSError("no such name")

    with pytest.raises(OSError, match="no such name"):
        Lookups(broken).resolve("nowhere.partner.example", "acme", 1)


def test_waiting_ends_at_the_callers_deadline(resolver):
    resolver.stalled.add("hooks.partner.example")
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        Lookups(resolver).resolver_for("acme", Deadline(0.3).remaining)("hooks.partner.example")
    assert 0.3 <= time.monotonic() - started < 0.3 + SLACK_SECONDS  # stalled until the test ends


def test_a_caller_whose_deadline_has_passed_starts_no_lookup(resolver):
    deadline = Deadline(0.001)
    assert eventually(deadline.has_passed, pause=0.001)
    with pytest.raises(TimeoutError):
        Lookups(resolver).resolver_for("acme", deadline.remaining)("hooks.partner.example")
    assert resolver.lookups == []


def test_a_stalled_name_does_not_hold_up_other_names(resolver):
    lookups = Lookups(resolver, threads=2)
    stuck(lookups, resolver, "acme", "stalled.partner.example")
    assert lookups.resolve("other.partner.example", "acme", 1) == ANSWER


def test_a_tenant_at_its_bound_is_refused_at_once_and_another_tenant_is_answered(resolver):
    lookups = Lookups(resolver, threads=8, per_tenant=2)
    stuck(lookups, resolver, "attacker", "a1.lame.example", "a2.lame.example")
    assert refused_at_once(lookups, "hooks.partner.example", "attacker")
    assert lookups.resolve("hooks.partner.example", "partner", 1) == ANSWER


def test_a_lookup_given_up_on_counts_until_the_resolver_answers_it(resolver):
    lookups = Lookups(resolver, threads=8, per_tenant=1)
    stuck(lookups, resolver, "acme", "slow.partner.example")
    assert refused_at_once(lookups, "hooks.partner.example", "acme")
    resolver.released.set()  # the stalled lookup answers at last
    assert eventually(lambda: _answers(lookups, "hooks.partner.example", "acme"))


def _answers(lookups: Lookups, host: str, tenant: str) -> bool:
    try:
        return lookups.resolve(host, tenant, 1) == ANSWER
    except LookupsBusy:
        return False


def test_with_every_thread_held_by_others_a_lookup_is_refused_at_once_not_queued(resolver):
    lookups = Lookups(resolver, threads=2, per_tenant=1)
    stuck(lookups, resolver, "attacker-1", "a.lame.example")
    stuck(lookups, resolver, "attacker-2", "b.lame.example")
    assert refused_at_once(lookups, "hooks.partner.example", "partner")
    assert "hooks.partner.example" not in resolver.lookups


def test_lookups_of_a_name_already_under_way_share_it_whatever_the_tenant(resolver):
    resolver.stalled.add("hooks.partner.example")
    lookups = Lookups(resolver, threads=8, per_tenant=1)
    answers = []
    waiting = [threading.Thread(target=lambda t=tenant: answers.append(lookups.resolve("hooks.partner.example", t, 5)))
               for tenant in "abcde"]
    for thread in waiting:
        thread.start()
    # Each tenant's one lookup in flight is its wait for the shared one: its next is refused.
    assert eventually(lambda: all(_busy(lookups, tenant) for tenant in "abcde"))
    resolver.released.set()
    for thread in waiting:
        thread.join()
    assert answers == [ANSWER] * 5
    assert resolver.lookups.count("hooks.partner.example") == 1


def _busy(lookups: Lookups, tenant: str) -> bool:
    """Whether `tenant` is at its bound: a lookup of another name is refused."""
    try:
        lookups.resolve("other.partner.example", tenant, 1)
    except LookupsBusy:
        return True
    return False


def test_a_caller_sharing_anothers_lookup_gives_its_count_back_when_it_stops_waiting(resolver):
    lookups = Lookups(resolver, threads=4, per_tenant=1)
    stuck(lookups, resolver, "attacker", "shared.lame.example")
    with pytest.raises(TimeoutError):
        lookups.resolve("shared.lame.example", "partner", 0.05)
    assert lookups.resolve("hooks.partner.example", "partner", 1) == ANSWER


def test_a_finished_lookup_is_not_reused_later(resolver):
    lookups = Lookups(resolver)
    lookups.resolve("hooks.partner.example", "acme", 1)
    lookups.resolve("hooks.partner.example", "acme", 1)
    assert resolver.lookups == ["hooks.partner.example"] * 2


def test_creating_lookups_starts_no_thread(resolver):
    before = threading.active_count()
    Lookups(resolver)
    assert threading.active_count() == before


def test_a_tenants_callers_asking_again_for_a_name_it_holds_cost_no_more_of_its_bound(resolver):
    """A partner whose endpoint's name never answers keeps asking for it (each attempt to that
    endpoint); its other names are still looked up."""
    lookups = Lookups(resolver, threads=8, per_tenant=2)
    stuck(lookups, resolver, "acme", "dead.partner.example")
    waiting = [threading.Thread(target=_waits, args=(lookups, "dead.partner.example", "acme"))
               for _ in range(3)]
    for thread in waiting:
        thread.start()
    assert eventually(lambda: resolver.lookups.count("dead.partner.example") == 1 and _waiting(lookups, "acme") == 3)
    assert lookups.resolve("hooks.partner.example", "acme", 1) == ANSWER
    resolver.released.set()
    for thread in waiting:
        thread.join()


def test_with_a_bound_on_waiting_callers_the_next_caller_is_refused_even_for_a_held_name(resolver):
    """Creates wait on request threads: a tenant asking over and over for one name that never
    answers holds at most `waiting_per_tenant` of them."""
    lookups = Lookups(resolver, threads=8, per_tenant=4, waiting_per_tenant=2)
    resolver.stalled.add("dead.partner.example")
    waiting = [threading.Thread(target=_waits, args=(lookups, "dead.partner.example", "attacker"))
               for _ in range(2)]
    for thread in waiting:
        thread.start()
    assert eventually(lambda: _waiting(lookups, "attacker") == 2)
    assert refused_at_once(lookups, "dead.partner.example", "attacker")
    assert lookups.resolve("hooks.partner.example", "partner", 1) == ANSWER
    resolver.released.set()
    for thread in waiting:
        thread.join()


def _waits(lookups: Lookups, host: str, tenant: str) -> None:
    """Wait for `host`'s answer: the stalled name's, once the test lets it answer."""
    assert lookups.resolve(host, tenant, 60) == ANSWER


def _waiting(lookups: Lookups, tenant: str) -> int:
    return lookups._waiting[tenant]  # noqa: SLF001 - the callers under way, which no answer shows


def test_with_a_bound_on_every_tenants_waiting_callers_a_third_tenant_is_refused_not_queued(resolver):
    """Two organizations' creates on names that never answer hold at most `waiting` request threads
    together: the others find one free (a create is refused at once, GET /me never waits)."""
    lookups = Lookups(resolver, threads=8, per_tenant=4, waiting_per_tenant=4, waiting=2)
    resolver.stalled.update({"dead-a.partner.example", "dead-b.partner.example"})
    waiting = [threading.Thread(target=_waits, args=(lookups, f"dead-{org}.partner.example", org)) for org in "ab"]
    for thread in waiting:
        thread.start()
    assert eventually(lambda: _waiting(lookups, "a") + _waiting(lookups, "b") == 2)
    assert refused_at_once(lookups, "hooks.partner.example", "c")
    resolver.released.set()
    for thread in waiting:
        thread.join()
    assert lookups.resolve("hooks.partner.example", "c", 1) == ANSWER
