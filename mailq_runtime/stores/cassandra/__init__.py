"""The Cassandra metadata store (cassandra-driver): one module per record's tables, as stores/embedded/ and
under the same names, each a class that implements a protocol of stores/protocols.py. Where a step joins
tables (the queue view, the mailboxes) it reads and writes them through small DAOs, one a table as James's.

- store: `CassandraStore`, the session and its prepared statements, consistency and credentials
- schema: keyspace and tables, created idempotently
- queue_view, configuration: records 31 and 32, and the configuration events
- blobs: record 39's generations, blobs, references and deletions
- mailboxes: record 23's mailboxes, projections and counters
- dead_letters, delayed_mails, held_mails: the mails the queue keeps out of the broker
- destinations: per destination domain, the mails by state and age, and the last failure; remote
  delivery's connection slots and send windows

Lightweight transactions are used only where a race needs one, and each module says why: creating a
queue and marking a mail deleted (queue_view), appending a configuration event (configuration),
emitting a generation (blobs), allocating a uid and claiming a mailbox's name (mailboxes), holding a
mail (held_mails), and taking a destination's connection slot or a mail of its rate (destinations).
Everything else is plain writes, ordered so that a crash leaves only what a later step heals.
"""

from .blobs import CassandraBlobTables
from .configuration import CassandraConfigurationEvents
from .dead_letters import CassandraDeadLetters
from .delayed_mails import CassandraDelayedMails
from .destinations import CassandraDestinations
from .held_mails import CassandraHeldMails
from .mailboxes import CassandraMailboxTables
from .options import CassandraOptions
from .queue_view import CassandraQueueView
from .store import CassandraStore

__all__ = [
    "CassandraBlobTables",
    "CassandraConfigurationEvents",
    "CassandraDeadLetters",
    "CassandraDelayedMails",
    "CassandraDestinations",
    "CassandraHeldMails",
    "CassandraMailboxTables",
    "CassandraOptions",
    "CassandraQueueView",
    "CassandraStore",
]
