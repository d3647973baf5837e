"""`mailq users`: the local users `mailq smtp` accepts mail for, those with a mailbox."""

from __future__ import annotations

import argparse

from mailq_runtime.errors import NoStore
from mailq_runtime.mailbox import INBOX
from mailq_runtime.model import MailAddress
from mailq_runtime.runtime import Runtime

from .arguments import checked_argument
from .output import Report


def _users_add(args: argparse.Namespace) -> Report:
    # Users are lowercased, as the worker delivers to them. The store must exist, as for `mailq smtp`.
    user = MailAddress(args.address).lower()
    with Runtime.open(args.url) as runtime:
        runtime.mailboxes.create(user, INBOX)
    return Report({"user": user, "mailbox": INBOX}, [f"added {user} (its {INBOX})"])


def _users_list(args: argparse.Namespace) -> Report:
    try:
        runtime = Runtime.open(args.url)
    except NoStore:
        return Report([], ["0 users"])
    with runtime:
        users = sorted({mailbox.user for mailbox in runtime.mailboxes.list()})
    return Report(users, [*users, f"{len(users)} users"])


def add_users_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("users", help="the local users `mailq smtp` accepts mail for")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    add = actions.add_parser("add", help="add a user: creates their INBOX")
    add.add_argument("address", metavar="ADDRESS", type=checked_argument(MailAddress))
    add.set_defaults(handler=_users_add)
    listing = actions.add_parser("list", help="every user with a mailbox")
    listing.set_defaults(handler=_users_list)
