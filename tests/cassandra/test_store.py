"""The Cassandra store itself: its schema (idempotent, laid out as the records read it), how it connects,
its consistency levels, and the errors it gives, none of which shows a password."""

from __future__ import annotations

import logging

import pytest
from cassandra import ConsistencyLevel

from mailq_runtime.errors import InvalidInput, NoStore, StoreUnavailable
from mailq_runtime.model import BlobId
from mailq_runtime.stores.cassandra import (
    CassandraBlobTables,
    CassandraDelayedMails,
    CassandraOptions,
    CassandraQueueView,
    CassandraStore,
)
from mailq_runtime.stores.cassandra.blobs import shard_of
from mailq_runtime.stores.cassandra.schema import DELETION_SHARDS, TABLES
from mailq_runtime.stores.records import DelayedMail
from tests.servers.fixtures import fresh_keyspace_name

from .conftest import CLOCK_SKEW_GRACE, open_cassandra

HOUR = 3600 * 1_000_000
T0 = 1_700_002_800 * 1_000_000


def keyspace_exists(store, name: str) -> bool:
    store.cluster.refresh_schema_metadata()
    return name in store.cluster.metadata.keyspaces


def test_creating_the_schema_again_keeps_what_is_there(cassandra, cassandra_server):
    CassandraQueueView(cassandra).create_queue("spool", T0, T0)
    again = open_cassandra(cassandra_server, cassandra.keyspace, create=True)
    try:
        assert CassandraQueueView(again).queue_names() == ["spool"]
        tables = again.cluster.metadata.keyspaces[cassandra.keyspace].tables
        assert set(TABLES) <= set(tables)
        compaction = tables["enqueued_mails"].options["compaction"]["class"]
        assert compaction.endswith("TimeWindowCompactionStrategy")
    finally:
        again.close()


def test_a_keyspace_lacking_a_column_of_this_version_is_refused_until_created_again(cassandra_server):
    name = fresh_keyspace_name()
    older = open_cassandra(cassandra_server, name, create=True)
    released = BlobId(1, "ab" * 32)
    try:
        older.session.execute(f"ALTER TABLE {name}.blob_deletions DROP owner")  # as an older version made it
        older.execute(
            "INSERT INTO blob_deletions (generation, shard, blob_id, deleted_at, gc_iteration) "
            "VALUES (?, ?, ?, ?, ?)",
            (1, shard_of(released), str(released), T0, 1),
        )
        with pytest.raises(NoStore, match=r"lacks the columns blob_deletions\.owner .*create the schema"):
            open_cassandra(cassandra_server, name)
        again = open_cassandra(cassandra_server, name, create=True)
        try:
            tables = CassandraBlobTables(again)
            assert tables.deletions_of(released) == [(T0, 1, None)]  # the older row kept, its owner unknown
            tables.add_deletions("m1", [released], 2, T0 + 1)
            assert tables.deletions_of(released) == [(T0, 1, None), (T0 + 1, 2, "m1")]
        finally:
            again.close()
        open_cassandra(cassandra_server, name).close()
    finally:
        older.session.execute(f"DROP KEYSPACE IF EXISTS {name}")
        older.close()


def test_a_keyspace_never_created_is_no_store_and_is_not_created(cassandra, cassandra_server):
    name = fresh_keyspace_name()
    with pytest.raises(NoStore, match=f"no keyspace '{name}'.*create the schema first"):
        open_cassandra(cassandra_server, name)
    assert not keyspace_exists(cassandra, name)


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"keyspace": "bad-name"}, "invalid keyspace name 'bad-name'"),
        ({"consistency": "SOMETIMES"}, "invalid consistency level 'SOMETIMES'"),
        ({"consistency": "LOCAL_SERIAL"}, "invalid consistency level 'LOCAL_SERIAL'"),
        ({"username": "mailq"}, "both a Cassandra username and a password"),
        ({"replication": {"replication_factor": 1}}, "invalid replication"),
        ({"replication": {"class": "NoSuchStrategy"}}, "Cassandra refused the replication"),
    ],
)
def test_bad_settings_are_refused_and_create_nothing(cassandra, cassandra_server, options, problem):
    name = fresh_keyspace_name()
    options = {"keyspace": name, **options}
    with pytest.raises(InvalidInput, match=problem):
        open_cassandra(cassandra_server, options.pop("keyspace"), create=True, **options)
    assert not keyspace_exists(cassandra, name)


def test_an_unreachable_cassandra_is_named_without_the_password(caplog):
    caplog.set_level(logging.DEBUG)
    secret = "s3cr3t-never-shown"
    with pytest.raises(StoreUnavailable) as raised:
        # A port nothing listens on.
        options = CassandraOptions(
            ["127.0.0.1"], "mailq", port=1, username="mailq", password=secret, request_timeout=6
        )
        CassandraStore(options)
    message = str(raised.value)
    assert message.startswith("cannot connect to Cassandra at 127.0.0.1 port 1: ")
    assert secret not in message and secret not in repr(raised.value)
    assert secret not in caplog.text


def test_statements_run_at_the_configured_consistency(cassandra, cassandra_server):
    read = cassandra.execute_async("SELECT queue FROM queues WHERE queue = ?", ("spool",))
    read.result()
    assert read.future.message.consistency_level == ConsistencyLevel.LOCAL_QUORUM
    one = open_cassandra(cassandra_server, cassandra.keyspace, consistency="one")
    try:
        read = one.execute_async("SELECT queue FROM queues WHERE queue = ?", ("spool",))
        read.result()
        assert read.future.message.consistency_level == ConsistencyLevel.ONE
        lwt = one.execute_async(
            "INSERT INTO queues (queue, created_at, first_slice_start) VALUES (?, ?, ?) IF NOT EXISTS",
            ("spool", T0, T0),
        )
        assert lwt.result().one().applied
        assert lwt.future.message.serial_consistency_level == ConsistencyLevel.SERIAL
    finally:
        one.close()


def test_a_generations_deletions_are_its_own_partitions(cassandra):
    """What a GC iteration reads: the deletions of one generation, by partition key alone (a query that
    would scan the table is refused without ALLOW FILTERING)."""
    tables = CassandraBlobTables(cassandra)
    owners = {f"m{n}": [BlobId(generation, f"{n:064x}") for generation in (3, 4)] for n in range(40)}
    for owner, blob_ids in owners.items():
        tables.add_deletions(owner, blob_ids, 5, T0)
    rows = cassandra.execute(
        "SELECT blob_id FROM blob_deletions WHERE generation = ? AND shard IN ?",
        (3, list(range(DELETION_SHARDS))),
    )
    assert sorted(row.blob_id for row in rows) == sorted(str(ids[0]) for ids in owners.values())
    assert len({shard_of(ids[0]) for ids in owners.values()}) > 1


def test_an_emptied_hour_of_delayed_mails_is_listed_no_more(cassandra):
    delayed = CassandraDelayedMails(cassandra, CLOCK_SKEW_GRACE)
    early, late = (
        DelayedMail("spool", "a" * 32, T0 + 5, 5, "p"),
        DelayedMail("spool", "b" * 32, T0 + 3 * HOUR, 5, "q"),
    )
    delayed.add(early)
    delayed.add(late)

    def listed() -> list[int]:
        rows = cassandra.execute("SELECT due_bucket FROM delayed_buckets WHERE queue = ?", ("spool",))
        return [row.due_bucket for row in rows]

    assert delayed.due("spool", T0 + HOUR, 10) == [early]
    delayed.remove(early)
    # Within the clock-skew grace after the hour, a lagging writer may still add to it: it stays listed.
    assert delayed.due("spool", T0 + HOUR + CLOCK_SKEW_GRACE - 1, 10) == []
    assert listed() == [T0, T0 + 3 * HOUR]
    assert delayed.due("spool", T0 + 2 * HOUR, 10) == []
    assert listed() == [T0 + 3 * HOUR]
    assert delayed.all("spool") == [late]
