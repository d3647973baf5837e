"""`mailq dead-letters`: list, show, requeue or purge the mails a queue will not deliver."""

from __future__ import annotations

import argparse
from typing import Any

from mailq_runtime.queue import DeadLetterItem

from .arguments import duration_argument, enqueue_id, queue_name
from .output import Report, table, time_text
from .queue_commands import open_queue


def _dead_letter_entry(item: DeadLetterItem) -> dict[str, Any]:
    return {
        "enqueue_id": item.enqueue_id,
        "name": item.name,
        "sender": item.sender,
        "recipients": item.recipients,
        "enqueued_time": None if item.enqueued_time is None else time_text(item.enqueued_time),
        "died_at": time_text(item.died_at),
        "reason": item.reason,
    }


def _dead_letters_list(args: argparse.Namespace) -> Report:
    with open_queue(args) as queue:
        entries = [_dead_letter_entry(item) for item in queue.dead_letters.list()]
    rows = [
        (
            e["enqueue_id"],
            e["died_at"],
            "?" if e["name"] is None else e["sender"] or "<>",  # "?": the message could not be read
            ",".join(e["recipients"]),
            e["name"] or "?",
            e["reason"],
        )
        for e in entries
    ]
    lines = table(("ENQUEUE ID", "DIED", "SENDER", "RECIPIENTS", "NAME", "REASON"), rows) if rows else []
    lines.append(f"{len(entries)} dead letters in {args.queue}")
    return Report(entries, lines)


def _dead_letters_show(args: argparse.Namespace) -> Report:
    with open_queue(args) as queue:
        item = queue.dead_letters.get(args.enqueue_id)
        message = item.mail.message
    # Text for the terminal and JSON; bytes that are not UTF-8 show as U+FFFD.
    data = {**_dead_letter_entry(item), "size": len(message), "message": message.decode(errors="replace")}
    shown_values = {**data, "recipients": ", ".join(item.recipients), "sender": item.sender or "<>"}
    lines = [f"{key.replace('_', ' ')}: {value}" for key, value in shown_values.items() if key != "message"]
    return Report(data, [*lines, "", data["message"]])


def _dead_letters_requeue(args: argparse.Namespace) -> Report:
    with open_queue(args) as queue:
        requeued = queue.dead_letters.requeue(args.enqueue_id, every=args.all)
    data = {"queue": args.queue, "requeued": requeued}
    return Report(data, [f"requeued {len(requeued)} dead letters in {args.queue}", *requeued])


def _dead_letters_purge(args: argparse.Namespace) -> Report:
    with open_queue(args) as queue:
        purged = queue.dead_letters.purge(args.enqueue_id, older_than=args.older_than)
    data = {"queue": args.queue, "purged": purged}
    return Report(data, [f"purged {purged} dead letters of {args.queue}"])


def add_dead_letters_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "dead-letters", help="list, show, requeue or purge the mails a queue will not deliver"
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="the dead letters of a queue, in enqueue order")
    listing.add_argument("queue", metavar="QUEUE", type=queue_name)
    listing.set_defaults(handler=_dead_letters_list)
    show = actions.add_parser("show", help="one dead letter with its message")
    show.add_argument("queue", metavar="QUEUE", type=queue_name)
    show.add_argument("enqueue_id", metavar="ENQUEUE_ID", type=enqueue_id)
    show.set_defaults(handler=_dead_letters_show)
    requeue = actions.add_parser(
        "requeue", help="enqueue dead letters again (under new enqueue ids), deliverable now"
    )
    requeue.add_argument("queue", metavar="QUEUE", type=queue_name)
    chosen = requeue.add_mutually_exclusive_group(required=True)
    chosen.add_argument("enqueue_id", metavar="ENQUEUE_ID", type=enqueue_id, nargs="?")
    chosen.add_argument("--all", action="store_true", help="every dead letter of the queue")
    requeue.set_defaults(handler=_dead_letters_requeue)
    purge = actions.add_parser("purge", help="delete dead letters and release their content")
    purge.add_argument("queue", metavar="QUEUE", type=queue_name)
    doomed = purge.add_mutually_exclusive_group(required=True)
    doomed.add_argument("enqueue_id", metavar="ENQUEUE_ID", type=enqueue_id, nargs="?")
    doomed.add_argument(
        "--older-than",
        type=duration_argument("older_than"),
        metavar="DURATION",
        help="those that died longer ago than this, e.g. 30d (0s: every one)",
    )
    purge.set_defaults(handler=_dead_letters_purge)
