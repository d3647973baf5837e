"""Argument types that check a value while the command line is parsed (bad input whether or not there is
data to look in), and the names and help of the pipeline's commands, which `mailq --help` lists before
they are imported."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from mailq_runtime.errors import InvalidInput, shown
from mailq_runtime.model import EnqueueId, QueueName, check_priority, parse_count, parse_duration

AddParser = Callable[[argparse._SubParsersAction], None]

# The maintenance pipeline's commands and their help: listed by `mailq --help`, their parsers added by
# `pipeline_commands` and `demo_command` once one of them is named.
PIPELINE_COMMANDS = {
    "gc": "one blob GC iteration (record 39) over the generations two behind the current one, or its "
    "plan (--dry-run), or a plan applied (--apply)",
    "blobs": "explain a blob: its generation, references, deletions and what the last GC did with it",
    "counters": "mailbox counters (record 23)",
    "queue": "mail queue maintenance (records 31 and 32)",
    "generation": "reference generations of the blob store (record 39)",
    "demo": "traffic through a fresh data dir, counter faults and rotations, then every maintenance asset",
}


def checked_argument(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argument type from one of the model's parsers: the value is checked while parsing (bad input
    whether or not there is data to look in), and its InvalidInput is argparse's complaint."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except InvalidInput as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return convert


queue_name = checked_argument(QueueName)
enqueue_id = checked_argument(EnqueueId)


def count_argument(name: str) -> Callable[[str], int]:
    """The argument type of a count (`parse_count`), for these commands and the pipeline's."""
    return checked_argument(lambda text: parse_count(text, name))


def duration_argument(name: str) -> Callable[[str], str]:
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


priority_argument = checked_argument(_text_priority)


def parse_listen(text: str) -> tuple[str, int]:
    """host:port, or [ipv6]:port."""
    host, colon, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not colon or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InvalidInput(f"invalid listen address {shown(text)}: expected host:port, e.g. 127.0.0.1:2525")
    return host, int(port)
