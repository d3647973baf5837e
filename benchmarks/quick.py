"""The `--quick` option every measure of this directory takes: a run of seconds, made by the suite
(tests/test_benchmarks.py) so that no measure breaks unseen. Its figures show that the measure runs, not
what anything costs.

Not a benchmark itself; imported by the scripts of this directory.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def parse_args(
    parser: argparse.ArgumentParser, quick: dict[str, object], argv: Sequence[str] | None = None
) -> argparse.Namespace:
    """`parser`'s arguments with `--quick` added, which makes `quick` the defaults: an option given on the
    command line still wins."""
    parser.add_argument(
        "--quick", action="store_true", help="a run of seconds that shows the measure works (no figures)"
    )
    args = parser.parse_args(argv)
    if args.quick:
        parser.set_defaults(**quick)
        args = parser.parse_args(argv)
    return args
