"""The Cassandra store's failures, at each of its entry points: an outage (the cable to the node pulled,
or too few replicas for the consistency level) is StoreUnavailable, a statement the server refuses as
written is StoreUnusable; both are chained to the driver's exception and fit on one line."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
from cassandra import InvalidRequest, Unavailable
from cassandra.cluster import NoHostAvailable

from mailq_runtime.errors import StoreUnavailable, StoreUnusable
from mailq_runtime.stores.cassandra import CassandraDeadLetters, CassandraOptions, CassandraStore
from mailq_servers.cassandra import CassandraServer
from tests.forwarder import Forwarder
from tests.servers.fixtures import fresh_keyspace_name

from .conftest import open_cassandra

T0 = 1_700_002_800 * 1_000_000
INSERT = "INSERT INTO queues (queue, created_at, first_slice_start) VALUES (?, ?, ?)"
SELECT = "SELECT queue FROM queues WHERE queue = ?"

# Each way a DAO runs a statement, on the queues table.
ENTRY_POINTS: dict[str, Callable[[CassandraStore], object]] = {
    "execute": lambda store: store.execute(SELECT, ("spool",)),
    "execute_async": lambda store: store.execute_async(SELECT, ("spool",)).result(),
    "execute_all": lambda store: store.execute_all(SELECT, [("spool",), ("other",)]),
    "batch": lambda store: store.batch(INSERT, [("spool", T0, T0)]),
    "applied": lambda store: store.applied(f"{INSERT} IF NOT EXISTS", ("spool", T0, T0)),
}


@pytest.fixture
def cable(cassandra_server: CassandraServer) -> Iterator[Forwarder]:
    with Forwarder(cassandra_server.host, cassandra_server.port) as forwarder:
        yield forwarder


@pytest.fixture
def wired(cassandra, cassandra_server: CassandraServer, cable: Forwarder) -> Iterator[CassandraStore]:
    """A store on the session's keyspace, reaching the node through `cable`."""
    store = CassandraStore(
        CassandraOptions(
            [cable.target[0]],
            cassandra.keyspace,
            port=cable.port,
            local_datacenter=cassandra_server.datacenter,
            request_timeout=10,
        )
    )
    yield store
    cable.restore()
    store.close()


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_a_pulled_cable_is_store_unavailable_at_each_entry_point(cassandra, wired, cable, entry):
    ENTRY_POINTS[entry](wired)  # prepared and answered while the cable is in
    cable.cut()
    with pytest.raises(StoreUnavailable) as raised:
        ENTRY_POINTS[entry](wired)
    assert isinstance(raised.value.__cause__, NoHostAvailable)
    message = str(raised.value)
    assert message.startswith(f"Cassandra at 127.0.0.1 port {cable.port} failed ")
    assert "queues" in message and "\n" not in message


def test_a_next_page_lost_with_the_connection_is_store_unavailable(cassandra, wired, cable):
    # One more row than the driver's page: the second page is fetched while the rows are read.
    cassandra.execute_all(INSERT, [(f"q{n}", T0, T0) for n in range(5001)])
    rows = iter(wired.execute("SELECT queue FROM queues"))
    first_page = [next(rows) for _ in range(5000)]
    cable.cut()
    with pytest.raises(StoreUnavailable, match="SELECT on queues \\(reading its next page\\)"):
        list(rows)
    assert len(first_page) == 5000


def test_too_few_replicas_for_the_consistency_level_is_store_unavailable(cassandra, cassandra_server):
    two = open_cassandra(cassandra_server, cassandra.keyspace, consistency="two")  # of one node
    try:
        with pytest.raises(StoreUnavailable, match="failed SELECT on dead_letters: .*Unavailable") as raised:
            CassandraDeadLetters(two).list("spool")
        assert "Cannot achieve consistency level TWO" in str(raised.value)
        # The driver tried every host (the one) before giving up: each host's reason is in its error.
        (reason,) = raised.value.__cause__.errors.values()
        assert isinstance(reason, Unavailable)
    finally:
        two.close()


def test_a_table_dropped_under_a_running_store_is_store_unusable(cassandra_server):
    """Not an outage: waiting does not bring the table back, so it is not StoreUnavailable, which
    callers may wait out."""
    name = fresh_keyspace_name()
    store = open_cassandra(cassandra_server, name, create=True)
    try:
        store.session.execute(f"DROP TABLE {name}.dead_letters")
        refused = f"refused SELECT on dead_letters in keyspace '{name}'"
        with pytest.raises(StoreUnusable, match=refused) as raised:
            CassandraDeadLetters(store).list("spool")
        assert isinstance(raised.value.__cause__, InvalidRequest)
        assert not isinstance(raised.value, StoreUnavailable)
    finally:
        store.session.execute(f"DROP KEYSPACE IF EXISTS {name}")
        store.close()


def test_the_node_is_reached_only_through_the_cable_and_the_store_recovers_once_it_is_back(wired, cable):
    """The driver keeps the contact point's address for a single node (it does not switch to the address
    the node gives in system.local), so pulling the cable is a whole outage; once it is back, the driver
    reconnects by itself."""
    assert [host.endpoint.port for host in wired.cluster.metadata.all_hosts()] == [cable.port]
    cable.cut()
    with pytest.raises(StoreUnavailable):
        wired.execute(SELECT, ("spool",))
    cable.restore()
    deadline = time.monotonic() + 30
    while True:
        try:
            assert wired.execute(SELECT, ("spool",)).one() is None
            break
        except StoreUnavailable:
            assert time.monotonic() < deadline, "the store did not reconnect within 30 s"
            time.sleep(0.1)
