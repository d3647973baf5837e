"""The `mailq` command: operate the mail queues of a deployment (James's webadmin queue routes).

Each subcommand registers itself through an `add_*_parser` function listed in `SUBCOMMANDS`; its handler
returns a `Report` that `main` prints as text, or as one JSON document with `--json`. Bad input (a
`MailqError`, a usage error, an unreadable file) exits with status 2 and one `mailq: error: ...` line.

The maintenance pipeline's commands (`PIPELINE_COMMANDS`) run Dagster and Spark: they live in
`assets.commands`, which is imported only when one of them is named, so the runtime's commands start
without either.
"""

from __future__ import annotations

import argparse
import importlib
import json
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NoReturn, TextIO

from .clock import MICROS_PER_SECOND, system_clock, to_datetime
from .config import QueueViewConfiguration
from .errors import ECHO_LIMIT, InvalidInput, MailqError, NoStore, shown
from .model import (
    NULL_SENDER_SPELLINGS,
    EnqueueId,
    Mail,
    QueueName,
    check_priority,
    parse_count,
    parse_duration,
)
from .overview import QueueOverview
from .queue import BrowseItem, DeadLetterItem, MailQueue, check_enqueue
from .runtime import Runtime
from .settings import DEFAULT_URL, URL_VARIABLE, Settings, redact
from .smtp.commands import add_smtp_parser, add_users_parser
from .worker import run_worker

EXIT_BAD_INPUT = 2
# Below this many items a bar would only flicker.
_PROGRESS_MINIMUM = 500
_PROGRESS_WIDTH = 30


@dataclass
class Report:
    """What a subcommand did: `data` is the JSON document, `lines` the human rendering of it, `status` the
    exit status once it is printed (non-zero when the work ran but failed, e.g. a failed asset check)."""

    data: Any
    lines: list[str] = field(default_factory=list)
    status: int = 0


class _UsageError(Exception):
    """argparse's complaint, turned into an exception so that `main` prints it like any other bad input."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _UsageError(f"{message} (see '{self.prog} --help')")


def _usage_message(message: str, argv: Sequence[str]) -> str:
    """argparse's complaint with every word of the command line it echoes (quoted or not, whole or after
    an option's '=') shown as the other errors show values: bounded, and a URL redacted."""
    words = {part for word in argv for part in (word, word.partition("=")[2]) if part}
    for word in sorted(words, key=len, reverse=True):
        display = redact(word) if "://" in word else word
        if display != word or len(word) > ECHO_LIMIT:
            message = message.replace(repr(word), shown(display)).replace(word, shown(display))
    return message


# Progress ---------------------------------------------------------------------------------------------------


Advance = Callable[[int], None]


@contextmanager
def progress_bar(label: str, total: int, stream: TextIO | None = None) -> Iterator[Advance]:
    """A one-line bar on stderr, redrawn at most ten times a second; silent unless stderr is a terminal."""
    stream = stream if stream is not None else sys.stderr
    if total < _PROGRESS_MINIMUM or not stream.isatty():
        yield lambda count=1: None
        return
    done = 0
    drawn_at = 0.0
    drawn = ""

    def draw() -> None:
        nonlocal drawn
        filled = _PROGRESS_WIDTH * min(done, total) // total
        drawn = f"{label} [{'#' * filled}{'-' * (_PROGRESS_WIDTH - filled)}] {done}/{total}"
        stream.write("\r" + drawn)
        stream.flush()

    def advance(count: int = 1) -> None:
        nonlocal done, drawn_at
        done += count
        now = time.monotonic()
        if now - drawn_at >= 0.1:
            drawn_at = now
            draw()

    try:
        yield advance
    finally:
        draw()
        # Erase the bar so that the command's own output starts on a clean line.
        stream.write("\r" + " " * len(drawn) + "\r")
        stream.flush()


# Shared helpers ---------------------------------------------------------------------------------------------


def checked_argument(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argument type from one of the model's parsers: the value is checked while parsing (bad input
    whether or not there is data to look in), and its InvalidInput is argparse's complaint."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except InvalidInput as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return convert


_queue_name = checked_argument(QueueName)
_enqueue_id = checked_argument(EnqueueId)


def count_argument(name: str) -> Callable[[str], int]:
    """The argument type of a count (`parse_count`), for these commands and the pipeline's."""
    return checked_argument(lambda text: parse_count(text, name))


def _duration(name: str) -> Callable[[str], str]:
    """Checks a duration while parsing and keeps its text, which the API reads the same way."""

    def check(text: str) -> str:
        parse_duration(text, name)
        return text

    return checked_argument(check)


def _text_priority(text: str) -> int:
    try:
        value: int | str = int(text)
    except ValueError:
        value = text  # check_priority refuses it, named as given
    return check_priority(value)


_priority = checked_argument(_text_priority)


def _existing_queue(runtime: Runtime, name: str) -> MailQueue:
    # Operator commands act on queues that exist: a typo must not create an empty queue.
    return runtime.queue(name, create=False)


@contextmanager
def _open_queue(args: argparse.Namespace) -> Iterator[MailQueue]:
    """The command's existing queue, in a runtime that already holds data: operator commands create
    neither a data dir nor a queue."""
    with Runtime.open(args.url) as runtime:
        yield _existing_queue(runtime, args.queue)


def _time(micros_or_moment: int | datetime) -> str:
    moment = micros_or_moment if isinstance(micros_or_moment, datetime) else to_datetime(micros_or_moment)
    return moment.astimezone(UTC).isoformat(timespec="seconds")


def _duration_text(micros: int) -> str:
    seconds = micros // MICROS_PER_SECOND
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in (header, *rows)
    ]


def _null_sender(sender: str) -> str | None:
    return None if sender in NULL_SENDER_SPELLINGS else sender


# Subcommands ------------------------------------------------------------------------------------------------


def _queues(args: argparse.Namespace) -> Report:
    try:
        runtime = Runtime.open(args.url)
    except NoStore:
        return Report([], ["no queues"])
    with runtime:
        now = to_datetime(runtime.clock())
        overviews = [_existing_queue(runtime, name).overview() for name in runtime.queues()]
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
            + ("" if o.next_due is None else f" next in {_span(o.next_due - now)}"),
            _state(o.dead_letters, o.oldest_dead_letter, False, now),
        )
        for o in overviews
    ]
    lines = _table(("QUEUE", "SIZE", "READY", "IN FLIGHT", "DELAYED", "DEAD LETTERS"), rows)
    lines.append("(the age of the oldest: since its enqueue, a dead letter's since it died; ? unknown)")
    return Report(queues, lines)


def _overview_entry(overview: QueueOverview) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": overview.queue}
    for key, value in asdict(overview).items():
        if key == "queue":
            continue
        entry[key] = _time(value) if isinstance(value, datetime) else value
    entry["unknown"] = list(overview.unknown)
    return entry


def _state(count: int | None, oldest: datetime | None, unknown: bool, now: datetime) -> str:
    if count is None:
        return "?"
    if unknown:
        return f"{count} (?)"
    return str(count) if oldest is None else f"{count} ({_span(now - oldest)})"


def _span(length: timedelta) -> str:
    """A duration in its two largest units: 3d4h, 2h05m, 7m30s, 12s."""
    seconds = max(int(length.total_seconds()), 0)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{seconds:02d}s"
    return f"{seconds}s"


def add_queues_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "queues",
        help="each queue's size, ready, in-flight, delayed and dead-lettered mails and the oldest of each",
    )
    parser.set_defaults(handler=_queues)


def _size(args: argparse.Namespace) -> Report:
    with _open_queue(args) as queue:
        size = queue.size()
    return Report({"name": args.queue, "size": size}, [f"{args.queue}: {size} mails"])


def add_size_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("size", help="how many mails a queue holds (from the per-slice counters)")
    parser.add_argument("queue", metavar="QUEUE", type=_queue_name)
    parser.set_defaults(handler=_size)


def _browse_entry(item: BrowseItem, now: datetime) -> dict[str, Any]:
    return {
        "enqueue_id": item.enqueue_id,
        "name": item.name,
        "sender": item.sender,
        "recipients": item.recipients,
        "enqueued_time": _time(item.enqueued_time),
        "next_delivery": _time(item.next_delivery),
        "delayed": item.next_delivery > now,
    }


def _browse(args: argparse.Namespace) -> Report:
    entries: list[dict[str, Any]] = []
    with _open_queue(args) as queue:
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
    lines = _table(("ENQUEUED", "NEXT DELIVERY", "SENDER", "RECIPIENTS", "NAME"), rows) if rows else []
    lines.append(f"{len(entries)} mails shown")
    return Report(entries, lines)


def add_browse_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("browse", help="list the mails of a queue in enqueue order")
    parser.add_argument("queue", metavar="QUEUE", type=_queue_name)
    parser.add_argument("--limit", type=count_argument("limit"), metavar="N", help="show at most N mails")
    parser.add_argument("--delayed", action="store_true", help="only mails whose next delivery is to come")
    parser.set_defaults(handler=_browse)


def _remove(args: argparse.Namespace) -> Report:
    given = (("sender", args.sender), ("name", args.name), ("recipient", args.recipient))
    criterion = {kind: value for kind, value in given if value is not None}
    with _open_queue(args) as queue:
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
    parser.add_argument("queue", metavar="QUEUE", type=_queue_name)
    criterion = parser.add_mutually_exclusive_group(required=True)
    criterion.add_argument("--sender", metavar="ADDR", help="'<>' for the null sender of bounces")
    criterion.add_argument("--name", metavar="NAME")
    criterion.add_argument("--recipient", metavar="ADDR", help="a mail goes if any of its recipients matches")
    parser.set_defaults(handler=_remove)


def _clear(args: argparse.Namespace) -> Report:
    with _open_queue(args) as queue:
        initial = queue.size()
        removed = queue.clear()
        remaining = queue.size()
    data = {"queue": args.queue, "removed": removed, "initial_count": initial, "remaining_count": remaining}
    return Report(data, [f"cleared {args.queue}: removed {removed} mails; {remaining} remain"])


def add_clear_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("clear", help="delete every mail of a queue")
    parser.add_argument("queue", metavar="QUEUE", type=_queue_name)
    parser.set_defaults(handler=_clear)


def _flush(args: argparse.Namespace) -> Report:
    with _open_queue(args) as queue:
        flushed = queue.flush()
    return Report(
        {"queue": args.queue, "flushed": flushed},
        [f"flushed {args.queue}: {flushed} delayed mails are deliverable now"],
    )


def add_flush_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("flush", help="make every delayed mail of a queue deliverable now")
    parser.add_argument("queue", metavar="QUEUE", type=_queue_name)
    parser.set_defaults(handler=_flush)


def _republish(args: argparse.Namespace) -> Report:
    with _open_queue(args) as queue:
        republished = queue.republish(args.older_than)
    data = {"queue": args.queue, "older_than": args.older_than, "republished": republished}
    return Report(data, [f"republished {republished} mails of {args.queue} older than {args.older_than}"])


def add_republish_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "republish",
        help="publish again the mails the view holds but the broker lost (RepublishNotProcessedMails)",
    )
    parser.add_argument("queue", metavar="QUEUE", type=_queue_name)
    parser.add_argument(
        "--older-than",
        required=True,
        type=_duration("older_than"),
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
    parser.add_argument("queue", metavar="QUEUE", type=_queue_name)
    parser.add_argument("file", type=Path, metavar="FILE.eml")
    parser.add_argument("--sender", required=True, metavar="ADDR", help="'' or '<>' for the null sender")
    parser.add_argument("--rcpt", required=True, action="append", metavar="ADDR", help="repeat it for more")
    parser.add_argument(
        "--delay",
        type=_duration("delay"),
        metavar="DURATION",
        help="not deliverable before this delay, e.g. 10m",
    )
    parser.add_argument(
        "--priority", type=_priority, metavar="N", help="0 (lowest) to 9 (highest), default 5"
    )
    parser.add_argument("--name", help="the mail's name (default: a random one)")
    parser.set_defaults(handler=_enqueue)


def _update_browse_start(args: argparse.Namespace) -> Report:
    with _open_queue(args) as queue:
        browse_start = queue.update_browse_start()
        content_start = queue.content_start()
    data = {"queue": args.queue, "browse_start": _time(browse_start), "content_start": _time(content_start)}
    line = f"{args.queue}: browse_start {data['browse_start']}, content_start {data['content_start']}"
    return Report(data, [line])


def _worker(args: argparse.Namespace) -> Report:
    stop = threading.Event()
    # SIGTERM and Ctrl-C ask for a graceful stop: the mail in hand is finished, then the worker returns.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    # A worker serves a queue that exists: checked on a runtime that writes nothing, so that a mistyped
    # URL or queue name creates nothing; then opened as a creating command, registering the URL's
    # configuration as James's queue does at start-up.
    with Runtime.open(args.url) as existing:
        existing.queue(args.queue, create=False)
    with Runtime.open(args.url, create=True) as runtime:
        stats = run_worker(
            runtime,
            args.queue,
            local_domains=args.domain,
            stop=stop,
            idle_timeout=args.idle_exit,
            retry_delay=args.retry_delay,
            max_attempts=args.max_attempts,
        )
    data = asdict(stats)
    return Report(
        data, [f"{args.queue}: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in data.items())]
    )


def add_worker_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("worker", help="deliver a queue's mails to the local recipients' INBOXes")
    parser.add_argument("--queue", default="spool", help="the queue to serve (default: spool)")
    parser.add_argument(
        "--domain",
        action="append",
        required=True,
        metavar="DOMAIN",
        help="a local domain; repeat it for more (other recipients are dead-lettered)",
    )
    parser.add_argument(
        "--idle-exit",
        type=_duration("idle_exit"),
        metavar="DURATION",
        help="return once the queue stayed empty this long, e.g. 30s (default: serve until stopped)",
    )
    parser.add_argument(
        "--retry-delay",
        default="5m",
        type=_duration("retry_delay"),
        metavar="DURATION",
        help="delay before a retry",
    )
    parser.add_argument(
        "--max-attempts", type=count_argument("max_attempts"), default=5, metavar="N", help="then dead-letter"
    )
    parser.set_defaults(handler=_worker)


def add_update_browse_start_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "update-browse-start", help="advance browse_start and clean the content before it (records 31, 32)"
    )
    parser.add_argument("queue", metavar="QUEUE", type=_queue_name)
    parser.set_defaults(handler=_update_browse_start)


def _dead_letter_entry(item: DeadLetterItem) -> dict[str, Any]:
    return {
        "enqueue_id": item.enqueue_id,
        "name": item.name,
        "sender": item.sender,
        "recipients": item.recipients,
        "enqueued_time": None if item.enqueued_time is None else _time(item.enqueued_time),
        "died_at": _time(item.died_at),
        "reason": item.reason,
    }


def _dead_letters_list(args: argparse.Namespace) -> Report:
    with _open_queue(args) as queue:
        entries = [_dead_letter_entry(item) for item in queue.dead_letters()]
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
    lines = _table(("ENQUEUE ID", "DIED", "SENDER", "RECIPIENTS", "NAME", "REASON"), rows) if rows else []
    lines.append(f"{len(entries)} dead letters in {args.queue}")
    return Report(entries, lines)


def _dead_letters_show(args: argparse.Namespace) -> Report:
    with _open_queue(args) as queue:
        item = queue.dead_letter(args.enqueue_id)
        message = item.mail.message
    # Text for the terminal and JSON; bytes that are not UTF-8 show as U+FFFD.
    data = {**_dead_letter_entry(item), "size": len(message), "message": message.decode(errors="replace")}
    shown_values = {**data, "recipients": ", ".join(item.recipients), "sender": item.sender or "<>"}
    lines = [f"{key.replace('_', ' ')}: {value}" for key, value in shown_values.items() if key != "message"]
    return Report(data, [*lines, "", data["message"]])


def _dead_letters_requeue(args: argparse.Namespace) -> Report:
    with _open_queue(args) as queue:
        requeued = queue.requeue_dead_letters(args.enqueue_id, every=args.all)
    data = {"queue": args.queue, "requeued": requeued}
    return Report(data, [f"requeued {len(requeued)} dead letters in {args.queue}", *requeued])


def _dead_letters_purge(args: argparse.Namespace) -> Report:
    with _open_queue(args) as queue:
        purged = queue.purge_dead_letters(args.enqueue_id, older_than=args.older_than)
    data = {"queue": args.queue, "purged": purged}
    return Report(data, [f"purged {purged} dead letters of {args.queue}"])


def add_dead_letters_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "dead-letters", help="list, show, requeue or purge the mails a queue will not deliver"
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="the dead letters of a queue, in enqueue order")
    listing.add_argument("queue", metavar="QUEUE", type=_queue_name)
    listing.set_defaults(handler=_dead_letters_list)
    show = actions.add_parser("show", help="one dead letter with its message")
    show.add_argument("queue", metavar="QUEUE", type=_queue_name)
    show.add_argument("enqueue_id", metavar="ENQUEUE_ID", type=_enqueue_id)
    show.set_defaults(handler=_dead_letters_show)
    requeue = actions.add_parser(
        "requeue", help="enqueue dead letters again (under new enqueue ids), deliverable now"
    )
    requeue.add_argument("queue", metavar="QUEUE", type=_queue_name)
    chosen = requeue.add_mutually_exclusive_group(required=True)
    chosen.add_argument("enqueue_id", metavar="ENQUEUE_ID", type=_enqueue_id, nargs="?")
    chosen.add_argument("--all", action="store_true", help="every dead letter of the queue")
    requeue.set_defaults(handler=_dead_letters_requeue)
    purge = actions.add_parser("purge", help="delete dead letters and release their content")
    purge.add_argument("queue", metavar="QUEUE", type=_queue_name)
    doomed = purge.add_mutually_exclusive_group(required=True)
    doomed.add_argument("enqueue_id", metavar="ENQUEUE_ID", type=_enqueue_id, nargs="?")
    doomed.add_argument(
        "--older-than",
        type=_duration("older_than"),
        metavar="DURATION",
        help="those that died longer ago than this, e.g. 30d (0s: every one)",
    )
    purge.set_defaults(handler=_dead_letters_purge)


def _configuration_report(configuration: QueueViewConfiguration, changes: int, **extra: Any) -> Report:
    data = {
        "slice_window_seconds": configuration.slice_window // MICROS_PER_SECOND,
        "bucket_count": configuration.bucket_count,
        "update_browse_start_pace": configuration.update_browse_start_pace,
        "changes": changes,
        **extra,
    }
    lines = [
        f"slice window:             {_duration_text(configuration.slice_window)}",
        f"bucket count:             {configuration.bucket_count}",
        f"update browse start pace: {configuration.update_browse_start_pace}",
        f"changes recorded:         {changes}",
    ]
    return Report(data, lines)


def _changes(runtime: Runtime) -> int:
    """Changes after the first event, which records the configuration the data dir started with."""
    return len(runtime.configuration.history()) - 1


def _config_show(args: argparse.Namespace) -> Report:
    with Runtime.open(args.url) as runtime:
        return _configuration_report(runtime.configuration.current(), _changes(runtime))


def _config_set(args: argparse.Namespace) -> Report:
    if args.slice_window is None and args.bucket_count is None and args.pace is None:
        raise InvalidInput("config set needs at least one of --slice-window, --bucket-count, --pace")
    slice_window = None if args.slice_window is None else parse_duration(args.slice_window)

    def wanted(current: QueueViewConfiguration) -> QueueViewConfiguration:
        # Unspecified values keep the current ones: changing the pace alone must not reset the slice
        # window and bucket count to their defaults, a change the rules may well refuse.
        return QueueViewConfiguration(
            slice_window=current.slice_window if slice_window is None else slice_window,
            bucket_count=current.bucket_count if args.bucket_count is None else args.bucket_count,
            update_browse_start_pace=current.update_browse_start_pace if args.pace is None else args.pace,
        )

    try:
        Runtime.open(args.url).close()
    except NoStore:
        # A new data dir starts from the default configuration (and the URL's values): the change is
        # checked against that before the data dir is created.
        settings = Settings.from_url(args.url)
        start = replace(QueueViewConfiguration(), **(settings.view_configuration or {}))
        start.validate_change(wanted(start))
    with Runtime.open(args.url, create=True) as runtime:
        changed = runtime.configuration.register(wanted(runtime.configuration.current()))
        report = _configuration_report(runtime.configuration.current(), _changes(runtime), changed=changed)
    report.lines.insert(0, "configuration changed" if changed else "configuration unchanged")
    return report


def add_config_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("config", help="show or change the queue view configuration (record 31)")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    show = actions.add_parser("show", help="the current configuration")
    show.set_defaults(handler=_config_show)
    change = actions.add_parser(
        "set", help="change it: the slice window only to a divisor, the bucket count only upwards"
    )
    change.add_argument("--slice-window", type=_duration("slice_window"), metavar="DURATION", help="e.g. 30m")
    change.add_argument("--bucket-count", type=count_argument("bucket_count"), metavar="N")
    change.add_argument(
        "--pace",
        type=count_argument("update_browse_start_pace"),
        metavar="N",
        help="update browse_start on 1 in N dequeues",
    )
    change.set_defaults(handler=_config_set)


def _schema_create(args: argparse.Namespace) -> Report:
    settings = Settings.from_url(args.url)
    with Runtime(settings, create=True) as runtime:
        created = runtime.deployment.created
    data = {"url": redact(settings.url), "created": created}
    done = "created" if created else "already there; anything it lacked added"
    return Report(data, [f"mailq schema of {redact(settings.url)}: {done}"])


def add_schema_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("schema", help="the store's schema (tables, keyspace)")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = actions.add_parser(
        "create", help="create the store and its tables, or add what an older one lacks (idempotent)"
    )
    create.set_defaults(handler=_schema_create)


AddParser = Callable[[argparse._SubParsersAction], None]

# A new subcommand joins by adding its `add_*_parser` here.
SUBCOMMANDS: list[AddParser] = [
    add_queues_parser,
    add_size_parser,
    add_browse_parser,
    add_remove_parser,
    add_clear_parser,
    add_flush_parser,
    add_republish_parser,
    add_enqueue_parser,
    add_update_browse_start_parser,
    add_dead_letters_parser,
    add_config_parser,
    add_worker_parser,
    add_schema_parser,
    add_smtp_parser,
    add_users_parser,
]

# The maintenance pipeline's commands and their help: listed by `mailq --help`, added by the module
# that implements them (its `PIPELINE_SUBCOMMANDS`, with this help) once one of them is named.
PIPELINE_MODULE = "assets.commands"
PIPELINE_COMMANDS = {
    "gc": "one blob GC iteration (record 39) over the generations two behind the current one, or its "
    "plan (--dry-run), or a plan applied (--apply)",
    "blobs": "explain a blob: its generation, references, deletions and what the last GC did with it",
    "counters": "mailbox counters (record 23)",
    "queue": "mail queue maintenance (records 31 and 32)",
    "generation": "reference generations of the blob store (record 39)",
    "demo": "traffic through a fresh data dir, counter faults and rotations, then every maintenance asset",
}


def _add_pipeline_placeholders(subparsers: argparse._SubParsersAction) -> None:
    """Each pipeline command as a parser of nothing (its arguments are left over): naming one is all
    `main` needs to know before it imports the real ones."""
    for name, help_text in PIPELINE_COMMANDS.items():
        subparsers.add_parser(name, help=help_text, add_help=False).set_defaults(handler=None)


def pipeline_subcommands() -> list[AddParser]:
    return list(importlib.import_module(PIPELINE_MODULE).PIPELINE_SUBCOMMANDS)


def build_parser(subcommands: Sequence[AddParser] | None = None) -> argparse.ArgumentParser:
    """The parser of SUBCOMMANDS and placeholders of the pipeline's commands, or of `subcommands`."""
    parser = _Parser(prog="mailq", description="Operate mailq's mail queues.")
    parser.add_argument("--url", help=f"the runtime to act on (default: ${URL_VARIABLE}, else {DEFAULT_URL})")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add_parser in SUBCOMMANDS if subcommands is None else subcommands:
        add_parser(subparsers)
    if subcommands is None:
        _add_pipeline_placeholders(subparsers)
    return parser


def main(argv: Sequence[str] | None = None, subcommands: Sequence[AddParser] | None = None) -> int:
    """Run one `mailq` command (the console script); `subcommands` replaces SUBCOMMANDS and the pipeline's
    placeholders. Returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        parser = build_parser(subcommands)
        args, left_over = parser.parse_known_args(argv)
        if args.handler is None:
            # A pipeline command: parsed again with the real parsers, now imported.
            parser = build_parser([*SUBCOMMANDS, *pipeline_subcommands()])
        if args.handler is None or left_over:
            args = parser.parse_args(argv)
        report = args.handler(args)
    except (MailqError, _UsageError) as error:
        message = _usage_message(str(error), argv) if isinstance(error, _UsageError) else str(error)
        print(f"mailq: error: {' '.join(message.split())}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except SystemExit as exit:  # argparse's --help
        return exit.code if isinstance(exit.code, int) else 0
    except KeyboardInterrupt:
        return 130
    if args.json:
        print(json.dumps(report.data, indent=2))
    else:
        print("\n".join(report.lines))
    return report.status


if __name__ == "__main__":
    sys.exit(main())
