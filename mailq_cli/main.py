"""The `mailq` console script: the parser of every subcommand, the dispatch to its handler, and the one way
a command ends (its report as text, or as one JSON document with `--json`; bad input, a `MailqError`, a
usage error or an unreadable file, as one `mailq: error: ...` line and exit status 2).

The runtime's subcommands register through an `add_*_parser` function listed in `SUBCOMMANDS`. The
maintenance pipeline's (`arguments.PIPELINE_COMMANDS`: gc, blobs, counters, queue, generation, demo) run
Dagster and Spark: `pipeline_commands` and `demo_command` are imported only once one of them is named, so
the runtime's commands start without either.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import NoReturn

from mailq_runtime.errors import ECHO_LIMIT, MailqError, shown
from mailq_runtime.settings import DEFAULT_URL, URL_VARIABLE, redact

from .arguments import PIPELINE_COMMANDS, AddParser
from .config_commands import add_config_parser, add_schema_parser
from .control_commands import (
    add_bounce_parser,
    add_held_parser,
    add_hold_parser,
    add_release_parser,
    add_resume_parser,
    add_retry_domain_parser,
    add_suspend_parser,
)
from .dead_letter_commands import add_dead_letters_parser
from .mailbox_commands import add_mailbox_parser
from .queue_commands import (
    add_browse_parser,
    add_clear_parser,
    add_enqueue_parser,
    add_flush_parser,
    add_queues_parser,
    add_remove_parser,
    add_republish_parser,
    add_size_parser,
    add_update_browse_start_parser,
)
from .smtp_command import add_smtp_parser
from .user_commands import add_users_parser
from .worker_command import add_worker_parser

EXIT_BAD_INPUT = 2

# A new subcommand of the runtime joins by adding its `add_*_parser` here.
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
    add_hold_parser,
    add_release_parser,
    add_held_parser,
    add_suspend_parser,
    add_resume_parser,
    add_retry_domain_parser,
    add_bounce_parser,
    add_config_parser,
    add_worker_parser,
    add_schema_parser,
    add_smtp_parser,
    add_users_parser,
    add_mailbox_parser,
]


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


def _add_pipeline_placeholders(subparsers: argparse._SubParsersAction) -> None:
    """Each pipeline command as a parser of nothing (its arguments are left over): naming one is all
    `main` needs to know before it imports the real ones."""
    for name, help_text in PIPELINE_COMMANDS.items():
        subparsers.add_parser(name, help=help_text, add_help=False).set_defaults(handler=None)


def pipeline_subcommands() -> list[AddParser]:
    """The pipeline's subcommands, which import Dagster and Spark."""
    from .demo_command import add_demo_parser
    from .pipeline_commands import PIPELINE_SUBCOMMANDS

    return [*PIPELINE_SUBCOMMANDS, add_demo_parser]


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


def main(argv: Sequence[str] | None = None) -> int:
    """Run one `mailq` command (the console script). Returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        parser = build_parser()
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
