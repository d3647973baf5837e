"""mailq's live runtime: the mail queue, the deduplicating blob store and the mailboxes.

It imports neither Dagster nor Spark; the maintenance pipeline (`assets`) builds on it.
"""

from .errors import (
    BlobNotFound,
    BlobStoreUnavailable,
    ConfigurationRejected,
    InvalidInput,
    LeaseExpired,
    MailqError,
    NoStore,
    StoreUnusable,
    UnknownMailbox,
    UnknownQueue,
)
from .faults import FaultInjector, InjectedFault
from .mailbox import Counters, Mailbox, MailboxName, MessageEntry
from .mailboxes import Mailboxes
from .model import BlobId, EnqueueId, Mail, MailAddress, MailboxId, MessageId, PerRecipientHeader, QueueName
from .runtime import Runtime
from .worker import WorkerStats, run_worker

__all__ = [
    "BlobId",
    "BlobNotFound",
    "BlobStoreUnavailable",
    "ConfigurationRejected",
    "Counters",
    "EnqueueId",
    "FaultInjector",
    "InjectedFault",
    "InvalidInput",
    "LeaseExpired",
    "Mail",
    "MailAddress",
    "Mailbox",
    "MailboxId",
    "MailboxName",
    "Mailboxes",
    "MailqError",
    "MessageEntry",
    "MessageId",
    "NoStore",
    "PerRecipientHeader",
    "QueueName",
    "Runtime",
    "StoreUnusable",
    "UnknownMailbox",
    "UnknownQueue",
    "WorkerStats",
    "run_worker",
]
