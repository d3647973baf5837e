"""Fixtures of the Cassandra store's tests: a keyspace a session on the harness's node (mailq_servers),
emptied before each test, and the embedded store's tables beside it, so that a test runs the same calls
on both and compares what they answer."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest

from mailq_runtime.stores.cassandra import (
    CassandraBlobTables,
    CassandraConfigurationEvents,
    CassandraDeadLetters,
    CassandraDelayedMails,
    CassandraMailboxTables,
    CassandraOptions,
    CassandraQueueView,
    CassandraStore,
)
from mailq_runtime.stores.cassandra.schema import TABLES
from mailq_runtime.stores.embedded import (
    EmbeddedBlobTables,
    EmbeddedConfigurationEvents,
    EmbeddedDeadLetters,
    EmbeddedDelayedMails,
    EmbeddedMailboxTables,
    EmbeddedQueueView,
    EmbeddedStore,
)
from mailq_servers.cassandra import CassandraServer

CLOCK_SKEW_GRACE = 60_000_000
T = TypeVar("T")


@dataclass
class Tables:
    """One store's DAOs, as the core will hold them."""

    name: str
    view: EmbeddedQueueView | CassandraQueueView
    configuration: EmbeddedConfigurationEvents | CassandraConfigurationEvents
    blobs: EmbeddedBlobTables | CassandraBlobTables
    mailboxes: EmbeddedMailboxTables | CassandraMailboxTables
    dead_letters: EmbeddedDeadLetters | CassandraDeadLetters
    delayed_mails: EmbeddedDelayedMails | CassandraDelayedMails


def embedded_tables(store: EmbeddedStore) -> Tables:
    return Tables(
        "embedded",
        EmbeddedQueueView(store),
        EmbeddedConfigurationEvents(store),
        EmbeddedBlobTables(store),
        EmbeddedMailboxTables(store),
        EmbeddedDeadLetters(store),
        EmbeddedDelayedMails(store),
    )


def cassandra_tables(store: CassandraStore) -> Tables:
    return Tables(
        "cassandra",
        CassandraQueueView(store),
        CassandraConfigurationEvents(store),
        CassandraBlobTables(store),
        CassandraMailboxTables(store),
        CassandraDeadLetters(store),
        CassandraDelayedMails(store, CLOCK_SKEW_GRACE),
    )


def open_cassandra(
    server: CassandraServer, keyspace: str, *, create: bool = False, **options: object
) -> CassandraStore:
    options = CassandraOptions(
        [server.host],
        keyspace,
        port=server.port,
        local_datacenter=server.datacenter,
        request_timeout=60,
        **options,
    )
    return CassandraStore(options, create=create)


@pytest.fixture(scope="session")
def cassandra_store(cassandra_server: CassandraServer, keyspace_name: str) -> Iterator[CassandraStore]:
    store = open_cassandra(cassandra_server, keyspace_name, create=True)
    yield store
    store.close()


@pytest.fixture
def cassandra(cassandra_store: CassandraStore) -> CassandraStore:
    """The session's store, every table emptied."""
    for table in TABLES:
        cassandra_store.session.execute(f"TRUNCATE {cassandra_store.keyspace}.{table}", timeout=120)
    return cassandra_store


@pytest.fixture
def both(tmp_path: Path, cassandra: CassandraStore) -> Iterator[tuple[Tables, Tables]]:
    """The embedded and the Cassandra tables, both empty."""
    embedded = EmbeddedStore(tmp_path / "data")
    yield embedded_tables(embedded), cassandra_tables(cassandra)
    embedded.close()


def same_on_both(both: tuple[Tables, Tables], scenario: Callable[[Tables], T]) -> T:
    """Run the scenario on each store; they must observe the same. Returns what they observed."""
    embedded, cassandra = both
    expected = scenario(embedded)
    assert scenario(cassandra) == expected
    return expected


@pytest.fixture(params=["embedded", "cassandra"])
def connect(
    request: pytest.FixtureRequest, tmp_path: Path, cassandra_server: CassandraServer, keyspace_name: str
) -> Iterator[Callable[[], Tables]]:
    """Opens one more connection to one store, as another process would: a race's contenders each
    take their own."""
    opened: list[EmbeddedStore | CassandraStore] = []
    if request.param == "cassandra":
        # Emptied through the first connection, which also makes the keyspace on a fresh session.
        request.getfixturevalue("cassandra")

    def open_tables() -> Tables:
        if request.param == "embedded":
            store = EmbeddedStore(tmp_path / "data")
            opened.append(store)
            return embedded_tables(store)
        store = open_cassandra(cassandra_server, keyspace_name)
        opened.append(store)
        return cassandra_tables(store)

    yield open_tables
    for store in opened:
        store.close()
