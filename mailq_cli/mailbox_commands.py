"""`mailq mailbox`: what was delivered, as an operator checks it: a user's mailboxes, a mailbox's messages,
one message, and the expunge of some (record 23's write order, so the counters stay right)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from email.parser import BytesHeaderParser
from email.policy import default
from typing import Any

from mailq_runtime.errors import InvalidInput, UnknownMailbox, shown
from mailq_runtime.mailbox import Mailbox, MailboxName, MessageSummary, check_uid, user_address
from mailq_runtime.mailboxes import Mailboxes
from mailq_runtime.model import MailAddress
from mailq_runtime.runtime import Runtime

from .arguments import checked_argument
from .output import Report, table, time_text


def _uid(text: str) -> int:
    if not text.isdigit():
        raise InvalidInput(f"invalid uid {shown(text)}: expected a positive integer")
    return check_uid(int(text))


def _subject(header: bytes) -> str:
    # The email package decodes RFC 2047 words; a header it cannot read shows as nothing.
    return str(BytesHeaderParser(policy=default).parsebytes(header).get("subject", "") or "")


def _entry(summary: MessageSummary) -> dict[str, Any]:
    return {
        "uid": summary.uid,
        "flags": sorted(summary.flags),
        "size": summary.size,
        "date": time_text(summary.internal_date),
        "subject": _subject(summary.header),
        "message_id": summary.message_id,
    }


def _mailboxes_of(mailboxes: Mailboxes, user: str) -> list[Mailbox]:
    found = mailboxes.list(user)
    if not found:
        raise UnknownMailbox(f"unknown user {user_address(user)}: no mailbox (`mailq users add` makes one)")
    return found


def _mailbox(mailboxes: Mailboxes, user: str, name: str) -> Mailbox:
    _mailboxes_of(mailboxes, user)  # an unknown user is named as such, not as a mailbox it lacks
    return mailboxes.get(user, name)


@contextmanager
def _named(box: Mailbox) -> Iterator[None]:
    """The runtime names a mailbox by its id in an unknown uid's error; a person knows it by its name."""
    try:
        yield
    except UnknownMailbox as error:
        raise UnknownMailbox(str(error).replace(f"mailbox {box.id}", f"{box.name} of {box.user}")) from None


def _list(args: argparse.Namespace) -> Report:
    with Runtime.open(args.url) as runtime:
        mailboxes = runtime.mailboxes
        if args.mailbox is None:
            rows = [
                {"mailbox": box.name, **vars(mailboxes.counters(box))}
                for box in _mailboxes_of(mailboxes, args.user)
            ]
            lines = table(
                ("MAILBOX", "MESSAGES", "UNSEEN"),
                [(r["mailbox"], str(r["count"]), str(r["unseen"])) for r in rows],
            )
            return Report(rows, [*lines, f"{len(rows)} mailboxes of {user_address(args.user)}"])
        box = _mailbox(mailboxes, args.user, args.mailbox)
        entries = [_entry(summary) for summary in mailboxes.summaries(box)]
    rows = [
        (str(e["uid"]), " ".join(e["flags"]) or "-", str(e["size"]), e["date"], e["subject"]) for e in entries
    ]
    lines = table(("UID", "FLAGS", "SIZE", "DATE", "SUBJECT"), rows) if rows else []
    return Report(entries, [*lines, f"{len(entries)} messages in {box.name} of {box.user}"])


def _show(args: argparse.Namespace) -> Report:
    with Runtime.open(args.url) as runtime:
        box = _mailbox(runtime.mailboxes, args.user, args.mailbox)
        with _named(box):
            message = runtime.mailboxes.read(box, args.uid, header_only=args.headers)
    # Text for the terminal and JSON; bytes that are not UTF-8 show as U+FFFD.
    text = message.decode(errors="replace")
    data = {"user": box.user, "mailbox": box.name, "uid": args.uid, "size": len(message), "message": text}
    return Report(data, [text.rstrip("\r\n")])


def _expunge(args: argparse.Namespace) -> Report:
    with Runtime.open(args.url) as runtime:
        box = _mailbox(runtime.mailboxes, args.user, args.mailbox)
        with _named(box):
            expunged = runtime.mailboxes.expunge(box, args.uids)
        counters = runtime.mailboxes.counters(box)
    data = {"user": box.user, "mailbox": box.name, "expunged": expunged, **vars(counters)}
    return Report(
        data, [f"expunged {expunged} messages from {box.name} of {box.user}: {counters.count} left"]
    )


def add_mailbox_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("mailbox", help="a user's mailboxes and messages: list, show, expunge")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    user = {"metavar": "USER", "type": checked_argument(MailAddress)}
    name = {"metavar": "MAILBOX", "type": checked_argument(MailboxName)}
    listing = actions.add_parser(
        "list", help="a user's mailboxes with their counts, or a mailbox's messages (uid, flags, size, ...)"
    )
    listing.add_argument("user", **user)
    listing.add_argument("mailbox", nargs="?", **name)
    listing.set_defaults(handler=_list)
    show = actions.add_parser("show", help="one message, as delivered")
    show.add_argument("user", **user)
    show.add_argument("mailbox", **name)
    show.add_argument("uid", metavar="UID", type=checked_argument(_uid))
    show.add_argument("--headers", action="store_true", help="its header section only")
    show.set_defaults(handler=_show)
    expunge = actions.add_parser(
        "expunge", help="remove messages; their content goes to the GC once no mailbox holds it"
    )
    expunge.add_argument("user", **user)
    expunge.add_argument("mailbox", **name)
    expunge.add_argument("uids", metavar="UID", nargs="+", type=checked_argument(_uid))
    expunge.set_defaults(handler=_expunge)
