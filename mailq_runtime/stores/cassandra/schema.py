"""The Cassandra schema: every table of records 23, 31, 32 and 39, the configuration events, dead letters and
delayed mails, created idempotently (`IF NOT EXISTS`) in a keyspace whose replication the caller gives.

Times are bigint microseconds since the epoch (UTC) and the mail's recipients and metadata JSON text, as
in the embedded store, so a row reads back as the same `EnqueuedMail`. Each table's comment says which
reads its key serves; the DAO modules say how they write it.
"""

from __future__ import annotations

from collections.abc import Mapping

from cassandra.cluster import Session
from cassandra.metadata import KeyspaceMetadata
from cassandra.protocol import RequestValidationException

from ...errors import InvalidInput

# Which blob_deletions partition of its generation a deletion goes to (crc32 of the blob id). A
# generation's deletions span a month or more, too many rows for one partition; a GC iteration reads
# these few partitions of each eligible generation and nothing else.
DELETION_SHARDS = 16

# Deletions and delayed mails removed by the collector and the delay publisher leave tombstones in
# partitions that are read again soon. A deleted row that comes back (a replica missed the delete for
# longer than this) is harmless there: a deletion of a blob already collected is collected again as a
# no-op, and a delayed mail published twice is delivered twice, which at-least-once allows and
# deleted_mails filters once the mail is done. So their tombstones are kept one hour, not ten days.
_SHORT_GC_GRACE = "gc_grace_seconds = 3600"
# Record 31: time-series tables compact by time window, so a slice's rows and their deletion end up
# in the same SSTables and whole SSTables expire together.
_TIME_WINDOWS = (
    "compaction = {'class': 'TimeWindowCompactionStrategy', "
    "'compaction_window_unit': 'HOURS', 'compaction_window_size': 1}"
)

TABLES = {
    # Records 31 and 32. `queues` lists the queues (a small table, read whole) with the slice each
    # started at, which a lightweight transaction decides once (see queue_view.py).
    "queues": """CREATE TABLE IF NOT EXISTS queues (
        queue text PRIMARY KEY, created_at bigint, first_slice_start bigint
    )""",
    # A slice's mails: one partition per (queue, slice, bucket), in enqueue id order.
    "enqueued_mails": f"""CREATE TABLE IF NOT EXISTS enqueued_mails (
        queue text, slice_start bigint, bucket int, enqueue_id text,
        enqueued_time bigint, next_delivery bigint, priority int, name text, sender text,
        recipients text, header_blob_id text, body_blob_id text, metadata text, counted_at bigint,
        PRIMARY KEY ((queue, slice_start, bucket), enqueue_id)
    ) WITH {_TIME_WINDOWS}""",
    # One partition a mail, as James's deletedMailsV2: a lightweight transaction marks it only once
    # and contends with nothing else. `counted_at` here and in enqueued_mails: the time of the share
    # that counts the mark or the row (queue_view.py).
    "deleted_mails": f"""CREATE TABLE IF NOT EXISTS deleted_mails (
        queue text, enqueue_id text, counted_at bigint, PRIMARY KEY ((queue, enqueue_id))
    ) WITH {_TIME_WINDOWS}""",
    "browse_start": "CREATE TABLE IF NOT EXISTS browse_start (queue text PRIMARY KEY, browse_start bigint)",
    "content_start": (
        "CREATE TABLE IF NOT EXISTS content_start (queue text PRIMARY KEY, content_start bigint)"
    ),
    # The per-slice counts, in one partition a queue: size() is one partition read, and the rows tell
    # which slices and buckets hold mails. A row a (slice, bucket, epoch, writer): each writer's share
    # of the mails counted in an epoch, and one row (epoch -1) of the epochs folded (queue_view.py).
    "slice_counters": """CREATE TABLE IF NOT EXISTS slice_counters (
        queue text, slice_start bigint, bucket int, epoch bigint, writer text,
        enqueued bigint, deleted bigint,
        PRIMARY KEY ((queue), slice_start, bucket, epoch, writer)
    )""",
    # The event-sourced configuration: an aggregate's events by position.
    "configuration_events": """CREATE TABLE IF NOT EXISTS configuration_events (
        aggregate text, position int, event text, at bigint, PRIMARY KEY ((aggregate), position)
    )""",
    # A queue's dead letters, by enqueue id.
    "dead_letters": """CREATE TABLE IF NOT EXISTS dead_letters (
        queue text, enqueue_id text, reason text, died_at bigint, payload text,
        PRIMARY KEY ((queue), enqueue_id)
    )""",
    # Delayed mails by due time, one partition a (queue, hour of the due time); `delayed_buckets`
    # lists the hours that may hold some.
    "delayed_mails": f"""CREATE TABLE IF NOT EXISTS delayed_mails (
        queue text, due_bucket bigint, due bigint, enqueue_id text, priority int, payload text,
        PRIMARY KEY ((queue, due_bucket), due, enqueue_id)
    ) WITH {_SHORT_GC_GRACE}""",
    "delayed_buckets": f"""CREATE TABLE IF NOT EXISTS delayed_buckets (
        queue text, due_bucket bigint, PRIMARY KEY ((queue), due_bucket)
    ) WITH {_SHORT_GC_GRACE}""",
    # A queue's held mails, by enqueue id; `parks` versions a row for the compare-and-sets.
    "held_mails": """CREATE TABLE IF NOT EXISTS held_mails (
        queue text, enqueue_id text, held_at bigint, parks int, payload text,
        PRIMARY KEY ((queue), enqueue_id)
    )""",
    # Per destination domain: a queue's mails by state and enqueue-time slot (each writer's share,
    # tallies.py), and the last failure.
    "destination_counters": """CREATE TABLE IF NOT EXISTS destination_counters (
        queue text, domain text, state text, slot bigint, writer text, mails bigint,
        PRIMARY KEY ((queue), domain, state, slot, writer)
    )""",
    "destination_notes": """CREATE TABLE IF NOT EXISTS destination_notes (
        queue text, domain text, error text, noted_at bigint, next_attempt bigint,
        PRIMARY KEY ((queue), domain)
    )""",
    "destination_suspensions": """CREATE TABLE IF NOT EXISTS destination_suspensions (
        queue text, domain text, until bigint, PRIMARY KEY ((queue), domain)
    )""",
    "destination_bounces": """CREATE TABLE IF NOT EXISTS destination_bounces (
        queue text, domain text, reason text, until bigint, PRIMARY KEY ((queue), domain)
    )""",
    # Remote delivery's limits per destination, whatever the queue: the slots its connections hold and
    # the mails sent per window of its rate; every row is written with a TTL (a lease, a window), so a
    # SIGKILLed worker's slot comes back by itself.
    "destination_slots": f"""CREATE TABLE IF NOT EXISTS destination_slots (
        destination text, slot int, holder text, PRIMARY KEY ((destination), slot)
    ) WITH {_SHORT_GC_GRACE}""",
    "destination_sends": f"""CREATE TABLE IF NOT EXISTS destination_sends (
        destination text, window_start bigint, mails int, PRIMARY KEY ((destination), window_start)
    ) WITH {_SHORT_GC_GRACE}""",
    # Record 39. Generations: each kind's numbers, newest first.
    "generations": """CREATE TABLE IF NOT EXISTS generations (
        kind text, number bigint, started_at bigint, PRIMARY KEY ((kind), number)
    ) WITH CLUSTERING ORDER BY (number DESC)""",
    "blobs": """CREATE TABLE IF NOT EXISTS blobs (
        blob_id text PRIMARY KEY, generation bigint, size bigint, created_at bigint
    )""",
    # An owner's references in one partition: saved and released together.
    "blob_references": """CREATE TABLE IF NOT EXISTS blob_references (
        owner text, blob_id text, generation bigint, PRIMARY KEY ((owner), blob_id)
    )""",
    # A generation's deletions in its DELETION_SHARDS partitions; a blob's repeated deletions apart by
    # their time.
    "blob_deletions": f"""CREATE TABLE IF NOT EXISTS blob_deletions (
        generation bigint, shard int, blob_id text, deleted_at bigint, gc_iteration bigint, owner text,
        PRIMARY KEY ((generation, shard), blob_id, deleted_at)
    ) WITH {_SHORT_GC_GRACE}""",
    # Record 23. `mailbox_paths` finds a user's mailbox by name (a lightweight transaction claims a
    # name); `mailboxes` holds the mailbox and its next uid.
    "mailboxes": """CREATE TABLE IF NOT EXISTS mailboxes (
        mailbox_id text PRIMARY KEY, user text, name text, next_uid bigint
    )""",
    "mailbox_paths": """CREATE TABLE IF NOT EXISTS mailbox_paths (
        user text, name text, mailbox_id text, PRIMARY KEY ((user), name)
    )""",
    "messages": """CREATE TABLE IF NOT EXISTS messages (
        message_id text PRIMARY KEY, header_blob_id text, body_blob_id text, size bigint,
        internal_date bigint
    )""",
    # The projection: a mailbox's messages by uid.
    "message_id_table": """CREATE TABLE IF NOT EXISTS message_id_table (
        mailbox_id text, uid bigint, message_id text, flags text, PRIMARY KEY ((mailbox_id), uid)
    )""",
    # The source of truth, by message id; its two indexes below find a mailbox's entries.
    "imap_uid_table": """CREATE TABLE IF NOT EXISTS imap_uid_table (
        message_id text, mailbox_id text, uid bigint, flags text, PRIMARY KEY ((message_id), mailbox_id)
    )""",
    # A mailbox's count and unseen, each writer's share (tallies.py).
    "mailbox_counters": """CREATE TABLE IF NOT EXISTS mailbox_counters (
        mailbox_id text, writer text, count bigint, unseen bigint, PRIMARY KEY ((mailbox_id), writer)
    )""",
}

# Columns added to a table after it first shipped, with their type: CREATE TABLE IF NOT EXISTS keeps an
# older keyspace's table as it is, so create_schema adds them. blob_deletions.owner: whose release wrote
# the row (null in rows written before).
ADDED_COLUMNS = {("blob_deletions", "owner"): "text"}

# Storage-attached indexes: the source of truth read by mailbox (its uids, the entry at a uid, a recount),
# as the embedded store's index on imap_uid_table (mailbox_id, uid). On a cluster such a read asks every
# replica set, so the hot path reads it only where the embedded store reads that index too.
INDEXES = {
    "imap_uid_table_mailbox": ("imap_uid_table", "mailbox_id"),
    "imap_uid_table_uid": ("imap_uid_table", "uid"),
    # The collector looks a few concerned blobs' references up by blob id rather than read them all; a
    # storage-attached index is written with its base row, so it adds no step to a save or a release.
    "blob_references_blob": ("blob_references", "blob_id"),
}


def validate_replication(replication: Mapping[str, object]) -> None:
    if not isinstance(replication, Mapping) or not isinstance(replication.get("class"), str):
        raise InvalidInput(
            f"invalid replication {replication!r}: a mapping with a 'class', e.g. "
            "{'class': 'SimpleStrategy', 'replication_factor': 1}"
        )
    for key, value in replication.items():
        if not isinstance(key, str) or isinstance(value, bool) or not isinstance(value, str | int):
            raise InvalidInput(
                f"invalid replication option {key!r}: {value!r} (a name and a string or number)"
            )


def _literal(value: str | int) -> str:
    return str(value) if isinstance(value, int) else "'" + value.replace("'", "''") + "'"


def create_schema(session: Session, keyspace: str, replication: Mapping[str, str | int]) -> None:
    """Create the keyspace and every table and index that does not exist yet; existing ones are kept
    as they are (a keyspace's replication too). What the driver's schema metadata already shows is not
    asked for again: a creating open of a complete keyspace costs no schema round trip."""
    existing = session.cluster.metadata.keyspaces.get(keyspace)
    tables = {} if existing is None else existing.tables
    indexes = set() if existing is None else set(existing.indexes)
    if existing is None:
        options = ", ".join(f"{_literal(key)}: {_literal(value)}" for key, value in replication.items())
        try:
            session.execute(f"CREATE KEYSPACE IF NOT EXISTS {keyspace} WITH replication = {{{options}}}")
        except RequestValidationException as error:
            raise InvalidInput(f"Cassandra refused the replication {{{options}}}: {error}") from None
    for name, cql in TABLES.items():
        if name not in tables:
            session.execute(cql.replace(f"EXISTS {name} (", f"EXISTS {keyspace}.{name} (", 1))
    for table, column in missing_columns(existing):
        # IF NOT EXISTS: another client may be completing the same keyspace.
        session.execute(
            f"ALTER TABLE {keyspace}.{table} ADD IF NOT EXISTS {column} {ADDED_COLUMNS[table, column]}"
        )
    for index, (table, column) in INDEXES.items():
        if index not in indexes:
            session.execute(
                f"CREATE INDEX IF NOT EXISTS {index} ON {keyspace}.{table} ({column}) USING 'sai'"
            )


def missing_columns(keyspace: KeyspaceMetadata | None) -> list[tuple[str, str]]:
    """The ADDED_COLUMNS an existing keyspace's tables lack (none for a keyspace created just now)."""
    if keyspace is None:
        return []
    return [
        (table, column)
        for table, column in ADDED_COLUMNS
        if table in keyspace.tables and column not in keyspace.tables[table].columns
    ]
