"""The embedded metadata store (SQLite, one file in WAL mode): one module per record's tables, as
stores/cassandra/, each a class with the methods of its Cassandra counterpart.

- store: `EmbeddedStore`, the connection, its transactions and the turn its threads take; schema.sql
- files: the data dir and the store's files, checked, created private and whole
- queue_view, configuration: records 31 and 32, and the configuration events
- blobs: record 39's generations, blobs, references and deletions
- mailboxes: record 23's mailboxes, projections and counters
- dead_letters, delayed_mails, held_mails: the mails the queue keeps out of the broker
- destinations: per destination domain, the mails by state and age, and the last failure; remote
  delivery's connection slots and send windows

Each method is one SQLite transaction of its own, joining the caller's transaction if one is open.
"""

from .blobs import EmbeddedBlobTables
from .configuration import EmbeddedConfigurationEvents
from .dead_letters import EmbeddedDeadLetters
from .delayed_mails import EmbeddedDelayedMails
from .destinations import EmbeddedDestinations
from .files import DATABASE_FILE
from .held_mails import EmbeddedHeldMails
from .mailboxes import EmbeddedMailboxTables
from .queue_view import EmbeddedQueueView
from .store import SYNCHRONOUS, EmbeddedStore

__all__ = [
    "DATABASE_FILE",
    "SYNCHRONOUS",
    "EmbeddedBlobTables",
    "EmbeddedConfigurationEvents",
    "EmbeddedDeadLetters",
    "EmbeddedDelayedMails",
    "EmbeddedDestinations",
    "EmbeddedHeldMails",
    "EmbeddedMailboxTables",
    "EmbeddedQueueView",
    "EmbeddedStore",
]
