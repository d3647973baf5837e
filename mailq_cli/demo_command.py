"""`mailq demo`: traffic through a fresh deployment, then every maintenance asset (see `demo`)."""

import argparse
import os
from pathlib import Path

from mailq_runtime.errors import InvalidInput
from mailq_runtime.settings import URL_VARIABLE

from . import demo
from .arguments import PIPELINE_COMMANDS, count_argument
from .output import Report
from .pipeline_run import EXIT_RUN_FAILED, check_dagster_home

DEMO_DIR = Path(".mailq-demo")


def _demo(args: argparse.Namespace) -> Report:
    if args.url is not None and args.data_dir is not None:
        raise InvalidInput("give the demo --url or --data-dir, not both")
    check_dagster_home()  # before the data dir is wiped
    # The data dir given is the demo's own; else the URL given or MAILQ_URL names the deployment it makes;
    # else its own default data dir.
    url = None if args.data_dir is not None else args.url or os.environ.get(URL_VARIABLE)
    if url is None:
        settings = demo.embedded(args.data_dir or DEMO_DIR, args.mails)
    else:
        settings = demo.new_deployment(url, args.mails)
    summary = demo.run(settings, mails=args.mails)
    return Report(summary, demo.describe(summary), 0 if summary["pipeline"]["success"] else EXIT_RUN_FAILED)


def add_demo_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help=PIPELINE_COMMANDS["demo"],
        description="Without --data-dir, the deployment of --url (default $MAILQ_URL), which must not exist "
        f"yet, else the data dir {DEMO_DIR}.",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        help=f"the demo's own embedded data dir, wiped at start (default: {DEMO_DIR}, unless a URL is given)",
    )
    parser.add_argument(
        "--mails",
        type=count_argument("mails"),
        default=3000,
        metavar="N",
        help="how many mails to generate",
    )
    parser.set_defaults(handler=_demo)
