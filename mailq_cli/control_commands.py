"""The operator's controls of remote delivery: hold, release and held (Postfix's postsuper -h/-H), suspend
and resume a destination domain (KumoMTA's suspend), retry-domain (postqueue -s)."""

from __future__ import annotations

import argparse
from datetime import datetime
from typing import Any

from mailq_runtime.clock import to_datetime
from mailq_runtime.errors import InvalidInput, shown
from mailq_runtime.queue import HeldItem

from .arguments import duration_argument, queue_name
from .output import Report, table, time_text
from .queue_commands import open_queue

_CRITERIA = ("sender", "recipient", "domain")


def _criterion(args: argparse.Namespace) -> tuple[str, str]:
    """What the command names: ("enqueue_id", id) or one of the criteria (argparse allows one at most)."""
    given = [(kind, getattr(args, kind)) for kind in _CRITERIA if getattr(args, kind) is not None]
    if args.enqueue_id is not None:
        given.insert(0, ("enqueue_id", args.enqueue_id))
    if len(given) != 1:
        # Refused here, before the store is opened, as argparse refuses two criteria.
        args.parser.error("name one mail by its enqueue id, or one of --sender, --recipient or --domain")
    return given[0]


def _control(args: argparse.Namespace) -> Report:
    kind, value = _criterion(args)
    with open_queue(args) as queue:
        act = queue.holds.hold if args.command == "hold" else queue.holds.release
        count = act(value) if kind == "enqueue_id" else act(**{kind: value})
    done = "held" if args.command == "hold" else "released"
    data = {"queue": args.queue, kind: value, done: count}
    return Report(data, [f"{done} {count} mails of {args.queue} ({kind.replace('_', ' ')} {value})"])


def _held_entry(item: HeldItem) -> dict[str, Any]:
    return {
        "enqueue_id": item.enqueue_id,
        "sender": item.sender,
        "recipients": item.recipients,
        "enqueued_time": time_text(item.enqueued_time),
        "held_at": time_text(item.held_at),
    }


def _held(args: argparse.Namespace) -> Report:
    with open_queue(args) as queue:
        entries = [_held_entry(item) for item in queue.holds.list()]
    rows = [
        (e["enqueue_id"], e["enqueued_time"], e["held_at"], e["sender"] or "<>", ",".join(e["recipients"]))
        for e in entries
    ]
    lines = table(("ENQUEUE ID", "ENQUEUED", "HELD", "SENDER", "RECIPIENTS"), rows) if rows else []
    lines.append(f"{len(entries)} mails held")
    return Report(entries, lines)


def _add_control_parser(subparsers: argparse._SubParsersAction, command: str, help_text: str) -> None:
    parser = subparsers.add_parser(command, help=help_text)
    parser.add_argument("queue", metavar="QUEUE", type=queue_name)
    parser.add_argument("enqueue_id", metavar="ENQUEUE_ID", nargs="?", help="one mail, by its enqueue id")
    criterion = parser.add_mutually_exclusive_group()
    criterion.add_argument("--sender", metavar="ADDR", help="'<>' for the null sender of bounces")
    criterion.add_argument("--recipient", metavar="ADDR", help="a mail matches if any recipient does")
    criterion.add_argument("--domain", metavar="DOMAIN", help="a mail matches if any recipient is there")
    parser.set_defaults(handler=_control, parser=parser)


def add_hold_parser(subparsers: argparse._SubParsersAction) -> None:
    _add_control_parser(subparsers, "hold", "keep mails from delivery until released (postsuper -h)")


def add_release_parser(subparsers: argparse._SubParsersAction) -> None:
    _add_control_parser(subparsers, "release", "deliver held mails again (postsuper -H)")


def add_held_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("held", help="list the held mails of a queue")
    parser.add_argument("queue", metavar="QUEUE", type=queue_name)
    parser.set_defaults(handler=_held)


def _time(text: str) -> datetime:
    """An ISO 8601 time with its zone ("Z" for UTC)."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidInput(f"invalid time {shown(text)}: use ISO 8601, as 2026-11-26T06:00Z") from None
    if moment.tzinfo is None:
        raise InvalidInput(f"invalid time {shown(text)}: give its time zone, as 2026-11-26T06:00Z")
    return moment


def _suspend(args: argparse.Namespace) -> Report:
    until = _time(args.until) if args.until is not None else args.duration
    with open_queue(args) as queue:
        end = queue.suspensions.suspend(args.domain, until)
    data = {"queue": args.queue, "domain": args.domain.lower(), "until": time_text(end)}
    return Report(data, [f"suspended {data['domain']} in {args.queue} until {data['until']}"])


def _resume(args: argparse.Namespace) -> Report:
    with open_queue(args) as queue:
        due = queue.suspensions.resume(args.domain)
    data = {"queue": args.queue, "domain": args.domain.lower(), "retried": due}
    return Report(data, [f"resumed {data['domain']} in {args.queue}: {due} delayed mails due now"])


def _retry_domain(args: argparse.Namespace) -> Report:
    with open_queue(args) as queue:
        due = queue.suspensions.retry(args.domain)
    data = {"queue": args.queue, "domain": args.domain.lower(), "retried": due}
    return Report(data, [f"{due} delayed mails for {data['domain']} in {args.queue} due now"])


def _domain_parser(
    subparsers: argparse._SubParsersAction, command: str, help_text: str
) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(command, help=help_text)
    parser.add_argument("queue", metavar="QUEUE", type=queue_name)
    parser.add_argument("domain", metavar="DOMAIN")
    return parser


def add_suspend_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = _domain_parser(subparsers, "suspend", "defer remote delivery to a domain until a time")
    end = parser.add_mutually_exclusive_group(required=True)
    end.add_argument("--until", metavar="TIME", help="an ISO 8601 time with its zone, as 2026-11-26T06:00Z")
    end.add_argument("--for", dest="duration", metavar="DURATION", type=duration_argument("--for"))
    parser.set_defaults(handler=_suspend)


def add_resume_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = _domain_parser(subparsers, "resume", "lift a domain's suspension and retry its mails now")
    parser.set_defaults(handler=_resume)


def add_retry_domain_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = _domain_parser(
        subparsers, "retry-domain", "make a domain's delayed mails due now (postqueue -s)"
    )
    parser.set_defaults(handler=_retry_domain)


def _bounce(args: argparse.Namespace) -> Report:
    with open_queue(args) as queue:
        due = queue.suspensions.bounce(args.domain, args.reason, args.window)
        bounce = queue.suspensions.bounced()[args.domain.lower()]
    until = time_text(to_datetime(bounce.until))
    data = {
        "queue": args.queue,
        "domain": bounce.domain,
        "reason": bounce.reason,
        "until": until,
        "retried": due,
    }
    return Report(
        data,
        [f"bouncing the mails for {bounce.domain} in {args.queue} enqueued until {until}: {bounce.reason}"],
    )


def add_bounce_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = _domain_parser(subparsers, "bounce", "return a domain's mails to their senders with a reason")
    parser.add_argument("--reason", required=True, metavar="TEXT", help="one line, in each notification")
    parser.add_argument(
        "--window",
        metavar="DURATION",
        type=duration_argument("--window"),
        help="also bounce the mails for the domain that arrive within this time from now",
    )
    parser.set_defaults(handler=_bounce)
