"""`mailq config` (the queue view configuration of record 31) and `mailq schema` (the store's tables)."""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

from mailq_runtime.clock import MICROS_PER_SECOND
from mailq_runtime.config import QueueViewConfiguration
from mailq_runtime.errors import InvalidInput, NoStore
from mailq_runtime.model import parse_duration
from mailq_runtime.runtime import Runtime
from mailq_runtime.settings import Settings, redact

from .arguments import count_argument, duration_argument
from .output import Report, duration_text


def _configuration_report(configuration: QueueViewConfiguration, changes: int, **extra: Any) -> Report:
    data = {
        "slice_window_seconds": configuration.slice_window // MICROS_PER_SECOND,
        "bucket_count": configuration.bucket_count,
        "update_browse_start_pace": configuration.update_browse_start_pace,
        "changes": changes,
        **extra,
    }
    lines = [
        f"slice window:             {duration_text(configuration.slice_window)}",
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
    change.add_argument(
        "--slice-window", type=duration_argument("slice_window"), metavar="DURATION", help="e.g. 30m"
    )
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
