"""mailq's live runtime: the mail queue, the deduplicating blob store and the mailboxes.

It imports neither Dagster nor Spark; the maintenance pipeline (`assets`) builds on it.
"""

from .errors import (
    BlobNotFound,
    ConfigurationRejected,
    InvalidInput,
    MailqError,
    UnknownMailbox,
    UnknownQueue,
)
from .model import BlobId, EnqueueId, Mail, MailAddress, MailboxId, MessageId, PerRecipientHeader, QueueName
from .runtime import Runtime

__all__ = [
    "BlobId",
    "BlobNotFound",
    "ConfigurationRejected",
    "EnqueueId",
    "InvalidInput",
    "Mail",
    "MailAddress",
    "MailboxId",
    "MailqError",
    "MessageId",
    "PerRecipientHeader",
    "QueueName",
    "Runtime",
    "UnknownMailbox",
    "UnknownQueue",
]
