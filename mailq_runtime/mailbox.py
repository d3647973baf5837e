"""Mailboxes as record 23 names them: mailbox names, flags, the records the mailbox API returns, and the
tables a store offers for them (the Mailboxes service is mailboxes.py)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from .errors import InvalidInput, UnknownMailbox, shown
from .model import MAX_COUNT, MailAddress, MailboxId, MessageId
from .stores.protocols import MailboxTables

INBOX = "INBOX"
DELIMITER = "."
SEEN = "\\Seen"
SYSTEM_FLAGS = ("\\Answered", "\\Deleted", "\\Draft", "\\Flagged", SEEN)
_SYSTEM_FLAGS = {flag.lower(): flag for flag in SYSTEM_FLAGS}
# RFC 3501 flag-keyword = atom: printable ASCII except the atom-specials ( ) { SP % * " \ ]
_KEYWORD = re.compile(r"[!#$&'+,\-./0-9:;<=>?@A-Z\[^_`a-z|}~]{1,100}")
_MAX_NAME_LENGTH = 200


class MailboxName(str):
    """An IMAP mailbox name: segments joined by '.', none empty or padded with blanks, no control
    characters, no LIST wildcards ('%', '*'), no namespace prefix ('#'). INBOX is case-insensitive and
    always spelled INBOX (RFC 3501)."""

    def __new__(cls, value: str) -> MailboxName:
        if not isinstance(value, str) or not value:
            raise InvalidInput(f"invalid mailbox name {shown(value)}: expected a non-empty string")
        problem = None
        if len(value) > _MAX_NAME_LENGTH:
            problem = f"longer than {_MAX_NAME_LENGTH} characters"
        elif not value.isprintable():
            problem = "control characters are not allowed"
        elif "%" in value or "*" in value:
            problem = "'%' and '*' are IMAP LIST wildcards"
        elif value.startswith("#"):
            problem = "'#' starts a namespace"
        segments = value.split(DELIMITER)
        if problem is None and any(not s or s != s.strip() for s in segments):
            problem = f"empty segment or blanks around a {DELIMITER!r}-separated segment"
        if problem is not None:
            raise InvalidInput(f"invalid mailbox name {shown(value)}: {problem}")
        if segments[0].upper() == INBOX:
            segments[0] = INBOX
        return super().__new__(cls, DELIMITER.join(segments))


def parse_flags(flags: Iterable[str]) -> frozenset[str]:
    """Validated flags: the IMAP system flags (any case, stored canonically) and keywords (atoms)."""
    if isinstance(flags, str | bytes):
        raise InvalidInput(f"flags are a collection of flag names, not the single string {shown(flags)}")
    try:
        names = list(flags)
    except TypeError:
        raise InvalidInput(f"flags are a collection of flag names, not {type(flags).__name__}") from None
    parsed = set()
    for flag in names:
        if not isinstance(flag, str):
            raise InvalidInput(f"invalid flag {shown(flag)}: expected a string")
        if flag.startswith("\\"):
            canonical = _SYSTEM_FLAGS.get(flag.lower())
            if canonical is None:
                raise InvalidInput(
                    f"invalid flag {shown(flag)}: system flags are {', '.join(SYSTEM_FLAGS)} "
                    "(\\Recent is the server's to set)"
                )
            parsed.add(canonical)
        elif _KEYWORD.fullmatch(flag):
            parsed.add(flag)
        else:
            raise InvalidInput(
                f"invalid flag {shown(flag)}: a keyword is 1-100 printable ASCII characters without "
                'blanks or any of ( ) {{ % * " \\ ]'
            )
    return frozenset(parsed)


def stored_flags(flags: frozenset[str]) -> str:
    return " ".join(sorted(flags))


def loaded_flags(flags: str) -> frozenset[str]:
    return frozenset(flags.split())


def unseen_count(flags: frozenset[str]) -> int:
    return 0 if SEEN in flags else 1


def check_uid(uid: int) -> int:
    if isinstance(uid, bool) or not isinstance(uid, int) or not 1 <= uid <= MAX_COUNT:
        raise InvalidInput(f"invalid uid {shown(uid)}: expected a positive integer up to {MAX_COUNT}")
    return uid


def unknown_user_reply(recipient: str) -> str:
    """The reply for a local domain's address without a mailbox, as Postfix's: `mailq smtp` answers RCPT
    with it, and the worker's notification of a bounce quotes it."""
    return f"550 5.1.1 <{recipient}>: Recipient address rejected: User unknown in local recipient table"


def user_address(user: str) -> MailAddress:
    # Users are compared case-insensitively, as the delivery worker addresses them: one INBOX per person.
    return MailAddress(MailAddress(user).lower())


@dataclass(frozen=True)
class Mailbox:
    id: MailboxId
    user: MailAddress
    name: MailboxName


@dataclass(frozen=True)
class Counters:
    count: int
    unseen: int


@dataclass(frozen=True)
class MessageEntry:
    uid: int
    message_id: MessageId
    flags: frozenset[str]


@dataclass(frozen=True)
class MessageSummary:
    """A message as a listing shows it: its projection entry, its size and arrival (`internal_date`, in
    microseconds) and its header section."""

    uid: int
    message_id: MessageId
    flags: frozenset[str]
    size: int
    internal_date: int
    header: bytes


class Appended(NamedTuple):
    message_id: MessageId
    uid: int


MailboxRef = Mailbox | MailboxId | str


def mailbox_of(row: tuple[str, str, str]) -> Mailbox:
    return Mailbox(MailboxId(row[0]), MailAddress(row[1]), MailboxName(row[2]))


def existing(tables: MailboxTables, mailbox: MailboxRef) -> MailboxId:
    """The id of a mailbox the tables hold; UnknownMailbox if they do not."""
    mailbox_id = mailbox.id if isinstance(mailbox, Mailbox) else MailboxId(mailbox)
    if tables.mailbox(mailbox_id) is None:
        raise UnknownMailbox(f"unknown mailbox {mailbox_id}")
    return mailbox_id


def entry_at(tables: MailboxTables, mailbox_id: MailboxId, uid: int) -> tuple[str, str]:
    """The source of truth's (message id, flags) at `uid`; UnknownMailbox if there is none."""
    found = tables.entry(mailbox_id, uid)
    if found is None:
        raise UnknownMailbox(f"no message with uid {uid} in mailbox {mailbox_id}")
    return found
