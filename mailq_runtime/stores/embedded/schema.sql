-- The embedded store: every table of records 23, 31, 32 and 39 in one SQLite file (WAL mode).
-- Times are integer microseconds since the epoch (UTC). Every index costs pages in each commit of the hot
-- path, so tables carry only the indexes that a live operation needs. The tables the maintenance
-- pipeline scans keep their rowid, so Spark reads them in parallel rowid ranges; the queue's own tables
-- are clustered by their primary key (WITHOUT ROWID).

-- Record 31: the queues and the mail queue view.
CREATE TABLE IF NOT EXISTS queues (
    queue TEXT PRIMARY KEY,
    created_at INTEGER NOT NULL
);

CREATE TABLE IF NOT EXISTS enqueued_mails (
    queue TEXT NOT NULL,
    slice_start INTEGER NOT NULL,          -- floor(enqueued_time / sliceWindow) * sliceWindow
    bucket INTEGER NOT NULL,               -- crc32(name) % bucketCount
    enqueue_id TEXT NOT NULL,
    enqueued_time INTEGER NOT NULL,
    next_delivery INTEGER NOT NULL,
    priority INTEGER NOT NULL,
    name TEXT NOT NULL,
    sender TEXT,                           -- NULL: the bounce sender
    recipients TEXT NOT NULL,              -- JSON list
    header_blob_id TEXT NOT NULL,
    body_blob_id TEXT NOT NULL,
    metadata TEXT NOT NULL,                -- JSON: state, error_message, remote host/addr, attributes ...
    PRIMARY KEY (queue, slice_start, bucket, enqueue_id)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS deleted_mails (
    queue TEXT NOT NULL,
    enqueue_id TEXT NOT NULL,
    PRIMARY KEY (queue, enqueue_id)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS browse_start (
    queue TEXT PRIMARY KEY,
    browse_start INTEGER NOT NULL
);

CREATE TABLE IF NOT EXISTS content_start (
    queue TEXT PRIMARY KEY,
    content_start INTEGER NOT NULL
);

-- The eventually consistent per-slice counters that make size() cheap (record 31's alternative).
CREATE TABLE IF NOT EXISTS slice_counters (
    queue TEXT NOT NULL,
    slice_start INTEGER NOT NULL,
    enqueued INTEGER NOT NULL DEFAULT 0,
    deleted INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, slice_start)
) WITHOUT ROWID;

-- The event-sourced queue view configuration (sliceWindow, bucketCount, updateBrowseStartPace).
CREATE TABLE IF NOT EXISTS configuration_events (
    seq INTEGER PRIMARY KEY,
    aggregate TEXT NOT NULL,
    event TEXT NOT NULL,                   -- JSON
    at INTEGER NOT NULL
);

-- The embedded broker: the messaging leg that RabbitMQ plays in the distributed deployment. It carries only
-- mails deliverable now; delays and dead letters are the metadata tables below.
CREATE TABLE IF NOT EXISTS broker_messages (
    id INTEGER PRIMARY KEY,
    queue TEXT NOT NULL,
    enqueue_id TEXT NOT NULL,
    priority INTEGER NOT NULL,
    available_at INTEGER NOT NULL,         -- end of the lease when leased, else 0 (or the due time of a
                                           -- delay published by a version before the delayed mails)
    lease TEXT,                            -- token of the consumer holding it, NULL when ready
    attempts INTEGER NOT NULL DEFAULT 0,
    payload TEXT NOT NULL                  -- the named, versioned record of queue_view.EnqueuedMail
);
-- By priority, then in enqueue order (enqueue ids sort by time): a flushed mail takes its place.
DROP INDEX IF EXISTS broker_ready;
CREATE INDEX IF NOT EXISTS broker_order ON broker_messages (queue, priority DESC, enqueue_id);

-- Dead letters, as James's mail repositories: mails that will not be delivered, with their reason and
-- their payload (whose blob ids their enqueue id keeps referenced), until requeued or purged.
CREATE TABLE IF NOT EXISTS dead_letters (
    id INTEGER PRIMARY KEY,
    queue TEXT NOT NULL,
    enqueue_id TEXT NOT NULL,
    reason TEXT NOT NULL,
    died_at INTEGER NOT NULL,
    payload TEXT NOT NULL
);
-- A letter is found, replaced and removed by its queue and enqueue id.
CREATE INDEX IF NOT EXISTS dead_letters_mail ON dead_letters (queue, enqueue_id);

-- Delayed mails by due time, until the publisher hands them to the broker.
CREATE TABLE IF NOT EXISTS delayed_mails (
    queue TEXT NOT NULL,
    due INTEGER NOT NULL,
    enqueue_id TEXT NOT NULL,
    priority INTEGER NOT NULL,
    payload TEXT NOT NULL,
    PRIMARY KEY (queue, due, enqueue_id)
) WITHOUT ROWID;

-- Mails an operator holds: a consumer parks a held mail's payload here instead of delivering it, and its
-- release hands the payload back; `parks` versions the row for the release's compare-and-set.
CREATE TABLE IF NOT EXISTS held_mails (
    queue TEXT NOT NULL,
    enqueue_id TEXT NOT NULL,
    held_at INTEGER NOT NULL,
    parks INTEGER NOT NULL,
    payload TEXT,
    PRIMARY KEY (queue, enqueue_id)
) WITHOUT ROWID;

-- Per destination domain: a queue's mails by state and enqueue-time slot, counted as they move, and
-- remote delivery's last failure there (`mailq queues --by-domain`).
CREATE TABLE IF NOT EXISTS destination_counters (
    queue TEXT NOT NULL,
    domain TEXT NOT NULL,
    state TEXT NOT NULL,                   -- 'queued' | 'deferred'
    slot INTEGER NOT NULL,                 -- start of the enqueue-time slot
    mails INTEGER NOT NULL,
    PRIMARY KEY (queue, domain, state, slot)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS destination_notes (
    queue TEXT NOT NULL,
    domain TEXT NOT NULL,
    error TEXT NOT NULL,
    noted_at INTEGER NOT NULL,
    next_attempt INTEGER,                  -- NULL: bounced, no retry due
    PRIMARY KEY (queue, domain)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS destination_suspensions (
    queue TEXT NOT NULL,
    domain TEXT NOT NULL,
    until INTEGER NOT NULL,
    PRIMARY KEY (queue, domain)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS destination_bounces (
    queue TEXT NOT NULL,
    domain TEXT NOT NULL,
    reason TEXT NOT NULL,
    until INTEGER NOT NULL,                -- mails enqueued up to this time are bounced
    PRIMARY KEY (queue, domain)
) WITHOUT ROWID;

-- Remote delivery's limits per destination (a domain, or a transport entry's target), whatever the
-- queue: a connection holds one of its slots until `expires` (renewed while it is open), and each
-- window of its rate counts the mails sent in it (rows of past windows are dropped by the next send).
CREATE TABLE IF NOT EXISTS destination_slots (
    destination TEXT NOT NULL,
    slot INTEGER NOT NULL,
    holder TEXT NOT NULL,
    expires INTEGER NOT NULL,
    PRIMARY KEY (destination, slot)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS destination_sends (
    destination TEXT NOT NULL,
    window_start INTEGER NOT NULL,
    mails INTEGER NOT NULL,
    PRIMARY KEY (destination, window_start)
) WITHOUT ROWID;

-- Record 39: reference generations, blobs, references and deletions.
CREATE TABLE IF NOT EXISTS generations (
    kind TEXT NOT NULL,                    -- 'reference_generation' | 'gc_iteration'
    number INTEGER NOT NULL,
    started_at INTEGER NOT NULL,
    PRIMARY KEY (kind, number)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS blobs (
    blob_id TEXT PRIMARY KEY,
    generation INTEGER NOT NULL,
    size INTEGER NOT NULL,
    created_at INTEGER NOT NULL
);

CREATE TABLE IF NOT EXISTS blob_references (
    owner TEXT NOT NULL,
    blob_id TEXT NOT NULL,
    generation INTEGER NOT NULL,
    PRIMARY KEY (owner, blob_id)
);
-- The collector looks a few concerned blobs' references up by blob id rather than read them all.
CREATE INDEX IF NOT EXISTS blob_references_blob ON blob_references (blob_id);

-- `owner`: whose release wrote the row (NULL in rows written before the column was added).
CREATE TABLE IF NOT EXISTS blob_deletions (
    blob_id TEXT NOT NULL,
    generation INTEGER NOT NULL,
    deleted_at INTEGER NOT NULL,
    gc_iteration INTEGER NOT NULL,
    owner TEXT
);
-- The collector removes the deletions of the blobs it collected.
CREATE INDEX IF NOT EXISTS blob_deletions_blob ON blob_deletions (blob_id);

-- Record 23: mailboxes, the message projections and their counters.
CREATE TABLE IF NOT EXISTS mailboxes (
    mailbox_id TEXT PRIMARY KEY,
    user TEXT NOT NULL,
    name TEXT NOT NULL,
    next_uid INTEGER NOT NULL DEFAULT 1,
    UNIQUE (user, name)
);

CREATE TABLE IF NOT EXISTS messages (
    message_id TEXT PRIMARY KEY,
    header_blob_id TEXT NOT NULL,
    body_blob_id TEXT NOT NULL,
    size INTEGER NOT NULL,
    internal_date INTEGER NOT NULL
);

-- The projection: lookup by mailbox and uid.
CREATE TABLE IF NOT EXISTS message_id_table (
    mailbox_id TEXT NOT NULL,
    uid INTEGER NOT NULL,
    message_id TEXT NOT NULL,
    flags TEXT NOT NULL,                   -- space-separated, sorted
    PRIMARY KEY (mailbox_id, uid)
);

-- The source of truth: lookup by message id.
CREATE TABLE IF NOT EXISTS imap_uid_table (
    message_id TEXT NOT NULL,
    mailbox_id TEXT NOT NULL,
    uid INTEGER NOT NULL,
    flags TEXT NOT NULL,
    PRIMARY KEY (message_id, mailbox_id)
);
CREATE INDEX IF NOT EXISTS imap_uid_mailbox ON imap_uid_table (mailbox_id, uid);

CREATE TABLE IF NOT EXISTS mailbox_counters (
    mailbox_id TEXT PRIMARY KEY,
    count INTEGER NOT NULL,
    unseen INTEGER NOT NULL
);

-- Blob content of the embedded default (the file system store is the alternative): see blobs/sqlite_store.py.
CREATE TABLE IF NOT EXISTS blob_content (
    blob_id TEXT PRIMARY KEY,
    data BLOB NOT NULL
);
