"""Tests for connections.py's budgets: the process's partner sockets, its idle connections and their
age, time stepped through the Sockets clock; real keep-alive receivers on loopback."""

import os
import resource
import threading

import pytest

from partner.outbound.sockets import Sockets, SocketsBusy
from partner.outbound.ssrf import Target
from partner.outbound.transport import Deadline, Transport
from tests.support import eventually

PATIENCE = 10.0  # the deadline of attempts meant to succeed: a loaded machine may be slow to answer


@pytest.fixture
def transport(request, clock):
    """A Transport whose Sockets take their budgets from the test's parameter and run on `clock`."""
    transport = Transport(sockets=Sockets(clock=clock, **getattr(request, "param", {})))
    yield transport
    transport.pools.clear()


def post(transport: Transport, port: int):
    target = Target(f"http://127.0.0.1:{port}/hook", "http", "127.0.0.1", port, "/hook", ("127.0.0.1",))
    return transport.post(target, b"{}", {"Content-Type": "application/json"}, Deadline(PATIENCE))


@pytest.mark.parametrize("transport", [{"most_idle": 2}], indirect=True)
def test_beyond_the_idle_budget_the_least_recently_used_connection_closes(transport, keep_alive_ports):
    receivers = keep_alive_ports(3)
    first, *others = receivers.ports

    assert all(post(transport, port).ok for port in receivers.ports)

    assert (transport.sockets.idle, transport.sockets.open) == (2, 2)
    assert eventually(lambda: receivers.open == 2)
    assert all(post(transport, port).ok for port in [*others, first])  # the others' kept, the first's dialled
    assert [receivers.accepted[port] for port in receivers.ports] == [2, 1, 1]


@pytest.mark.parametrize("transport", [{"idle_seconds": 30}], indirect=True)
def test_a_connection_idle_for_idle_seconds_closes_at_the_next_sweep(transport, keep_alive_ports, clock):
    receivers = keep_alive_ports()
    assert post(transport, receivers.ports[0]).ok

    clock.advance(29.9)
    transport.sockets.close_idle()
    assert transport.sockets.idle == 1
    clock.advance(0.1)
    transport.sockets.close_idle()

    assert (transport.sockets.idle, transport.sockets.open) == (0, 0)
    assert eventually(lambda: receivers.open == 0)


@pytest.mark.parametrize("transport", [{"most_open": 1}], indirect=True)
def test_a_dial_past_the_descriptor_budget_closes_an_idle_connection_first(transport, keep_alive_ports):
    receivers = keep_alive_ports(2)

    assert all(post(transport, port).ok for port in receivers.ports)

    assert (transport.sockets.idle, transport.sockets.open) == (1, 1)
    assert eventually(lambda: receivers.open == 1)


@pytest.mark.parametrize("transport", [{"most_open": 1}], indirect=True)
def test_no_dial_past_the_descriptor_budget_while_every_socket_is_in_use(transport, keep_alive_ports):
    slow, quick = keep_alive_ports(delay=1), keep_alive_ports()
    results = []
    in_flight = threading.Thread(target=lambda: results.append(post(transport, slow.ports[0])))
    in_flight.start()
    assert eventually(lambda: slow.open == 1)

    with pytest.raises(SocketsBusy):
        post(transport, quick.ports[0])

    in_flight.join()
    assert results[0].ok and quick.accepted.total() == 0
    assert post(transport, quick.ports[0]).ok  # the slow one's connection, idle now, made room


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs Linux descriptors")
def test_a_dial_the_process_has_no_descriptor_for_is_sockets_busy(transport, keep_alive_ports):
    receivers = keep_alive_ports()
    limits = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowest_free = os.dup(0)  # the descriptor the next socket would get
    os.close(lowest_free)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, limits[1]))
    try:
        with pytest.raises(SocketsBusy, match="Too many open files"):
            post(transport, receivers.ports[0])
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, limits)
    assert (transport.sockets.open, receivers.accepted.total()) == (0, 0)


def test_closing_a_targets_idle_connections_leaves_the_others(transport, keep_alive_ports):
    receivers = keep_alive_ports(2)
    assert all(post(transport, port).ok for port in receivers.ports)

    transport.pools.close_idle_to("http", "127.0.0.1", receivers.ports[0])

    assert (transport.sockets.idle, transport.sockets.open) == (1, 1)
    assert post(transport, receivers.ports[1]).ok
    assert [receivers.accepted[port] for port in receivers.ports] == [1, 1]
