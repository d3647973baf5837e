"""The runtime's table reader (mailq_runtime/tables.py) on every deployment, without Spark: a plan's
partitions read every row once, the reads by key read exactly their rows, and a store that fails while
it is read is the store's mailq error."""

from __future__ import annotations

from pathlib import Path

import pytest

from mailq_runtime import Runtime
from mailq_runtime.deployments import table_reader
from mailq_runtime.errors import InvalidInput, NoStore, StoreUnusable
from mailq_runtime.settings import Settings
from mailq_runtime.tables import TableRead, check_read, chosen
from tests.runtime.backends import Backend

OWNERS = 40


def rows(settings: Settings, table: str, names: list[str], count: int, **keys) -> list[tuple]:
    reader = table_reader(settings)
    read = check_read(reader, TableRead(table, chosen(table, reader.columns(table), names), **keys))
    partitions = reader.plan(read, count)
    assert len(partitions) >= 1
    batches = [batch for partition in partitions for batch in reader.read(read, partition)]
    assert all(batch.schema.names == names for batch in batches)
    return [row for batch in batches for row in zip(*(c.to_pylist() for c in batch.columns), strict=True)]


def test_every_row_once_whatever_the_partitions(backend: Backend) -> None:
    runtime = backend.open()
    for n in range(OWNERS):
        runtime.blobs.save_all(f"owner-{n}", [b"shared", b"own %d" % n])
        if n % 4 == 0:
            runtime.generations.rotate()
    expected = sorted((owner, blob_id) for owner, blob_id, _ in backend.blob_state().references)
    settings = Settings.from_url(backend.url())
    for count in (1, 3, 16):
        assert sorted(rows(settings, "blob_references", ["owner", "blob_id"], count)) == expected
    wanted = (2, 5)
    assert sorted(rows(settings, "blob_references", ["owner"], 3, generations=wanted)) == sorted(
        (owner,) for owner, _, generation in backend.blob_state().references if generation in wanted
    )


def test_a_read_of_some_mailboxes_reads_only_theirs(backend: Backend) -> None:
    runtime = backend.open()
    alice = runtime.mailboxes.create("alice@example.com", "INBOX")
    bob = runtime.mailboxes.create("bob@example.com", "INBOX")
    for mailbox, messages in ((alice, 2), (bob, 3)):
        for n in range(messages):
            runtime.mailboxes.append(mailbox, b"Subject: %d\r\n\r\nbody\r\n" % n)
    settings = Settings.from_url(backend.url())
    read = rows(settings, "mailbox_counters", ["mailbox_id", "count"], 4, mailboxes=(str(bob),))
    assert read == [(str(bob), 3)]
    assert rows(settings, "mailbox_counters", ["count"], 4, mailboxes=()) == []


def test_unknown_tables_columns_and_filters_are_refused(backend: Backend) -> None:
    backend.open()
    reader = table_reader(Settings.from_url(backend.url()))
    with pytest.raises(InvalidInput, match="invalid columns"):
        chosen("blobs", reader.columns("blobs"), ["nope"])
    with pytest.raises(InvalidInput, match="'generations' needs a generation column"):
        check_read(reader, TableRead("mailboxes", tuple(reader.columns("mailboxes")), generations=(1,)))


def test_an_embedded_store_that_breaks_while_read_is_the_stores_error(tmp_path: Path) -> None:
    with pytest.raises(NoStore, match="no embedded store at"):
        table_reader(Settings.from_url(f"embedded://{tmp_path / 'none'}"))
    data_dir = tmp_path / "data"
    Runtime.open(f"embedded://{data_dir}", create=True).close()
    reader = table_reader(Settings.from_url(f"embedded://{data_dir}"))
    read = TableRead("blobs", tuple(reader.columns("blobs")))
    (data_dir / "mailq.db").write_bytes(b"not a database" * 1000)
    with pytest.raises(StoreUnusable, match="not an SQLite database"):
        reader.plan(read, 2)
