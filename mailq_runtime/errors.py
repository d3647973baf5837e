"""The errors mailq raises. Each names what was wrong; an operation that raises one changed nothing,
except where its docstring says what it did."""


class MailqError(Exception):
    """Base of every error mailq raises on purpose."""


class InvalidInput(MailqError, ValueError):
    """A value failed validation at the edge (a name, an address, a delay, a message, a blob id ...)."""


class NoStore(MailqError, LookupError):
    """No data at the store's location, where an operation that only works on existing data looked."""


class StoreUnusable(MailqError):
    """The store's files cannot be used as they are: damaged, of the wrong kind, not this user's, not
    writable, or failing (a full disk, an I/O error). The message names the place and the problem."""


class UnknownQueue(MailqError, LookupError):
    """The named queue does not exist."""


class UnknownMailbox(MailqError, LookupError):
    """The mailbox (or the message in it) does not exist."""


class ConfigurationRejected(MailqError, ValueError):
    """A queue view configuration change that the rules of record 31 forbid."""


class BlobNotFound(MailqError, LookupError):
    """A blob id that is well formed but has no content in the blob store."""


class LeaseExpired(MailqError):
    """A dequeued mail's lease was lost: it expired and the broker gave the mail to another consumer, which
    now settles it. `retry()` and `reject()` change nothing; `done()` still records the mail as delivered
    (so it is not delivered once more by a consumer that has not loaded it yet), but the consumer holding
    it may deliver it again: delivery is at-least-once. (A lease lost with the broker's connection is a
    BrokerUnavailable instead: no lease expired, the broker delivers the mail again.)"""


# How much of a user's value an error message echoes: enough to recognise it, while a 10,000-character
# name or a 300-digit number does not flood the terminal or the log.
ECHO_LIMIT = 64


def shown(value: object) -> str:
    """`value` as every error message shows it: its repr, or the first ECHO_LIMIT characters (bytes) of a
    longer one, followed by its length."""
    if isinstance(value, str | bytes) and len(value) > ECHO_LIMIT:
        unit = "characters" if isinstance(value, str) else "bytes"
        return f"{value[:ECHO_LIMIT]!r}... ({len(value)} {unit})"
    if isinstance(value, int) and value.bit_length() > 4 * ECHO_LIMIT:
        # repr() of an integer past 4300 digits raises instead of printing.
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    text = repr(value)
    if len(text) > ECHO_LIMIT:
        return f"{text[:ECHO_LIMIT]}... ({len(text)} characters)"
    return text


class BlobStoreUnavailable(MailqError):
    """The blob store could not serve a request: a missing bucket, refused credentials, an unreachable
    endpoint. The message names the bucket and endpoint and the problem, never a credential."""


class StoreUnavailable(MailqError, ConnectionError):
    """The metadata store could not be reached (no host answered, or it refused the credentials)."""


class BrokerUnavailable(MailqError, ConnectionError):
    """The message broker could not take or give a message: it could not be reached, or it confirmed no
    publish in time. The message names the broker's address and the problem, never a credential."""


class BrokerRefused(BrokerUnavailable):
    """The message broker refused the login, the virtual host or a queue's declaration: waiting for it
    will not help, its configuration must change."""


# The failures of a backend (a server away, a disk full), as opposed to bad input or a lost lease: a call
# that meets one gives back what it holds, so that the work waits for the backend, not for a timeout.
BACKEND_FAILURES = (StoreUnavailable, StoreUnusable, BlobStoreUnavailable, BrokerUnavailable)
