"""The queue commands (James's webadmin queue routes): queues, size, browse, remove, clear, flush,
republish, enqueue and update-browse-start."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any

from mailq_runtime.clock import system_clock, to_datetime
from mailq_runtime.errors import InvalidInput, NoStore, shown
from mailq_runtime.model import NULL_SENDER_SPELLINGS, Mail
from mailq_runtime.queue import BrowseItem, MailQueue, QueueOverview, check_enqueue
from mailq_runtime.runtime import Runtime
from mailq_runtime.settings import Settings

from .arguments import count_argument, duration_argument, priority_argument, queue_name
from .destination_output import by_domain_report
from .output import Report, progress_bar, span, table, time_text


def existing_queue(runtime: Runtime, name: str) -> MailQueue:
    # Operator commands act on queues that exist: a typo must not create an empty queue.
    return runtime.queue(name, create=False)


@contextmanager
def open_queue(args: argparse.Namespace) -> Iterator[MailQueue]:
    """The command's existing queue, in a runtime that already holds data: operator commands create
    neither a data dir nor a queue."""
    with Runtime.open(args.url) as runtime:
        yield existing_queue(runtime, args.queue)


def _null_sender(sender: str) -> str | None:
    return None if sender in NULL_SENDER_SPELLINGS else sender


# Subcommands ------------------------------------------------------------------------------------------------


def _queues(args: argparse.Namespace) -> Report:
    if args.by_domain:
        return by_domain_report(args)
    try:
        runtime = Runtime.open(args.url)
    except NoStore:
        return Report([], ["no queues"])
    with runtime:
        now = to_datetime(runtime.clock())
        overviews = [existing_queue(runtime, name).overviews.overview() for name in runtime.queues()]
    queues = [_overview_entry(overview) for overview in overviews]
    if not queues:
        return Report(queues, ["no queues"])
    rows = [
        (
            o.queue,
            str(o.size),
            _state(o.ready, o.oldest_ready, "oldest_ready" in o.unknown, now),
            _state(o.in_flight, o.oldest_in_flight, "oldest_in_flight" in o.unknown, now),
            _state(o.delayed, o.oldest_delayed, False, now)
            + ("" if o.next_due is None else f" next in {span(o.next_due - now)}"),
            _state(o.dead_letters, o.oldest_dead_letter, False, now),
            str(o.held),
        )
        for o in overviews
    ]
    lines = table(("QUEUE", "SIZE", "READY", "IN FLIGHT", "DELAYED", "DEAD LETTERS", "HELD"), rows)
    lines.append("(the age of the oldest: since its enqueue, a dead letter's since it died; ? unknown)")
    return Report(queues, lines)


def _overview_entry(overview: QueueOverview) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": overview.queue}
    for key, value in asdict(overview).items():
        if key == "queue":
            continue
        entry[key] = time_text(value) if isinstance(value, datetime) else value
    entry["unknown"] = list(overview.unknown)
    return entry


def _state(count: int | None, oldest: datetime | None, unknown: bool, now: datetime) -> str:
    if count is None:
        return "?"
    if unknown:
        return f"{count} (?)"
    return str(count) if oldest is None else f"{count} ({span(now - oldest)})"


def add_queues_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "queues",
        help="each queue's size, its mails by state (ready, in flight, delayed, dead, held), the oldest",
    )
    parser.add_argument(
        "--by-domain",
        action="store_true",
        help="per destination domain: mails by state in qshape's age buckets, last error, next attempt",
    )
    parser.set_defaults(handler=_queues)


def _size(args: argparse.Namespace) -> Report:
    with open_queue(args) as queue:
        size = queue.size()
    return Report({"name": args.queue, "size": size}, [f"{args.queue}: {size} mails"])


def add_size_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("size", help="how many mails a queue holds (from the per-slice counters)")
    parser.add_argument("queue", metavar="QUEUE", type=queue_name)
    parser.set_defaults(handler=_size)


def _browse_entry(item: BrowseItem, now: datetime) -> dict[str, Any]:
    return {
        "enqueue_id": item.enqueue_id,
        "name": item.name,
        "sender": item.sender,
        "recipients": item.recipients,
        "enqueued_time": time_text(item.enqueued_time),
        "next_delivery": time_text(item.next_delivery),
        "delayed": item.next_delivery > now,
    }


def _browse(args: argparse.Namespace) -> Report:
    entries: list[dict[str, Any]] = []
    with open_queue(args) as queue:
        now = to_datetime(queue.clock())
        # The bar counts scanned mails; with --delayed most of them may be skipped, so size() is the total.
        total = queue.size() if args.delayed or args.limit is None else min(args.limit, queue.size())
        with progress_bar(f"browse {args.queue}", total) as advance:
            for item in queue.browse():
                advance(1)
                if args.delayed and item.next_delivery <= now:
                    continue
                entries.append(_browse_entry(item, now))
                if args.limit is not None and len(entries) >= args.limit:
                    break
    rows = [
        (
            e["enqueued_time"],
            e["next_delivery"] + (" (delayed)" if e["delayed"] else ""),
            e["sender"] or "<>",
            ",".join(e["recipients"]),
            e["name"],
        )
        for e in entries
    ]
    lines = table(("ENQUEUED", "NEXT DELIVERY", "SENDER", "RECIPIENTS", "NAME"), rows) if rows else []
    lines.append(f"{len(entries)} mails shown")
    return Report(entries, lines)


def add_browse_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("browse", help="list the mails of a queue in enqueue order")
    parser.add_argument("queue", metavar="QUEUE", type=queue_name)
    parser.add_argument("--limit", type=count_argument("limit"), metavar="N", help="show at most N mails")
    parser.add_argument("--delayed", action="store_true", help="only mails whose next delivery is to come")
    parser.set_defaults(handler=_browse)


def _remove(args: argparse.Namespace) -> Report:
    given = (("sender", args.sender), ("name", args.name), ("recipient", args.recipient))
    criterion = {kind: value for kind, value in given if value is not None}
    with open_queue(args) as queue:
        initial = queue.size()
        removed = queue.remove(**criterion)
        remaining = queue.size()
    [(kind, value)] = criterion.items()
    data = {
        "queue": args.queue,
        kind: value,
        "removed": removed,
        "initial_count": initial,
        "remaining_count": remaining,
    }
    return Report(data, [f"removed {removed} mails from {args.queue} ({kind} {value}); {remaining} remain"])


def add_remove_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("remove", help="delete the mails matching one criterion")
    parser.add_argument("queue", metavar="QUEUE", type=queue_name)
    criterion = parser.add_mutually_exclusive_group(required=True)
    criterion.add_argument("--sender", metavar="ADDR", help="'<>' for the null sender of bounces")
    criterion.add_argument("--name", metavar="NAME")
    criterion.add_argument("--recipient", metavar="ADDR", help="a mail goes if any of its recipients matches")
    parser.set_defaults(handler=_remove)


def _clear(args: argparse.Namespace) -> Report:
    with open_queue(args) as queue:
        initial = queue.size()
        removed = queue.clear()
        remaining = queue.size()
    data = {"queue": args.queue, "removed": removed, "initial_count": initial, "remaining_count": remaining}
    return Report(data, [f"cleared {args.queue}: removed {removed} mails; {remaining} remain"])


def add_clear_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("clear", help="delete every mail of a queue")
    parser.add_argument("queue", metavar="QUEUE", type=queue_name)
    parser.set_defaults(handler=_clear)


def _flush(args: argparse.Namespace) -> Report:
    with open_queue(args) as queue:
        flushed = queue.flush()
    return Report(
        {"queue": args.queue, "flushed": flushed},
        [f"flushed {args.queue}: {flushed} delayed mails are deliverable now"],
    )


def add_flush_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("flush", help="make every delayed mail of a queue deliverable now")
    parser.add_argument("queue", metavar="QUEUE", type=queue_name)
    parser.set_defaults(handler=_flush)


def _republish(args: argparse.Namespace) -> Report:
    with open_queue(args) as queue:
        republished = queue.republish(args.older_than)
    data = {"queue": args.queue, "older_than": args.older_than, "republished": republished}
    return Report(data, [f"republished {republished} mails of {args.queue} older than {args.older_than}"])


def add_republish_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "republish",
        help="publish again the mails the view holds but the broker lost (RepublishNotProcessedMails)",
    )
    parser.add_argument("queue", metavar="QUEUE", type=queue_name)
    parser.add_argument(
        "--older-than",
        required=True,
        type=duration_argument("older_than"),
        metavar="DURATION",
        help="e.g. 1h, 30m, 2d",
    )
    parser.set_defaults(handler=_republish)


def _read_message(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as error:
        raise InvalidInput(f"cannot read {shown(str(path))}: {error.strerror or error}") from None


def _enqueue(args: argparse.Namespace) -> Report:
    message = _read_message(args.file)
    # Validated before the store is opened: bad input must create neither a data dir nor a queue.
    mail_fields: dict[str, Any] = {"name": args.name} if args.name is not None else {}
    mail = Mail(recipients=tuple(args.rcpt), message=message, sender=_null_sender(args.sender), **mail_fields)
    max_size = Settings.from_url(args.url).max_message_size
    check_enqueue(mail, args.delay, args.priority, max_size, system_clock())
    with Runtime.open(args.url, create=True) as runtime:
        enqueue_id = runtime.queue(args.queue).enqueue(mail, delay=args.delay, priority=args.priority)
    data = {"queue": args.queue, "enqueue_id": enqueue_id, "name": mail.name, "size": len(message)}
    return Report(data, [f"enqueued {mail.name} ({len(message)} bytes) in {args.queue} as {enqueue_id}"])


def add_enqueue_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("enqueue", help="enqueue an RFC 5322 message (creates the queue if new)")
    parser.add_argument("queue", metavar="QUEUE", type=queue_name)
    parser.add_argument("file", type=Path, metavar="FILE.eml")
    parser.add_argument("--sender", required=True, metavar="ADDR", help="'' or '<>' for the null sender")
    parser.add_argument("--rcpt", required=True, action="append", metavar="ADDR", help="repeat it for more")
    parser.add_argument(
        "--delay",
        type=duration_argument("delay"),
        metavar="DURATION",
        help="not deliverable before this delay, e.g. 10m",
    )
    parser.add_argument(
        "--priority", type=priority_argument, metavar="N", help="0 (lowest) to 9 (highest), default 5"
    )
    parser.add_argument("--name", help="the mail's name (default: a random one)")
    parser.set_defaults(handler=_enqueue)


def _update_browse_start(args: argparse.Namespace) -> Report:
    with open_queue(args) as queue:
        browse_start = queue.maintenance.update_browse_start()
        content_start = queue.maintenance.content_start()
    data = {
        "queue": args.queue,
        "browse_start": time_text(browse_start),
        "content_start": time_text(content_start),
    }
    line = f"{args.queue}: browse_start {data['browse_start']}, content_start {data['content_start']}"
    return Report(data, [line])


def add_update_browse_start_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "update-browse-start", help="advance browse_start and clean the content before it (records 31, 32)"
    )
    parser.add_argument("queue", metavar="QUEUE", type=queue_name)
    parser.set_defaults(handler=_update_browse_start)
