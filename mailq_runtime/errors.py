"""The errors mailq raises. Each names what was wrong; an operation that raises one changed nothing."""


class MailqError(Exception):
    """Base of every error mailq raises on purpose."""


class InvalidInput(MailqError, ValueError):
    """A value failed validation at the edge (a name, an address, a delay, a message, a blob id ...)."""


class NoStore(MailqError, LookupError):
    """No data at the store's location, where an operation that only works on existing data looked."""


class UnknownQueue(MailqError, LookupError):
    """The named queue does not exist."""


class UnknownMailbox(MailqError, LookupError):
    """The mailbox (or the message in it) does not exist."""


class ConfigurationRejected(MailqError, ValueError):
    """A queue view configuration change that the rules of record 31 forbid."""


class BlobNotFound(MailqError, LookupError):
    """A blob id that is well formed but has no content in the blob store."""


class StoreUnavailable(MailqError, ConnectionError):
    """The metadata store could not be reached (no host answered, or it refused the credentials)."""
