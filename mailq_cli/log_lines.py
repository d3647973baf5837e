"""The log lines of the long-running commands (`mailq smtp`, `mailq worker`) on stderr, as Postfix's
`maillog`: one line per event, with the time, the program and its process."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def logging_to_stderr(logger: str, program: str) -> Iterator[None]:
    """`logger`'s lines from INFO on, on stderr while the command runs; `program` names it in each line."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter(f"%(asctime)s mailq/{program}[%(process)d]: %(message)s", "%b %d %H:%M:%S")
    )
    selected = logging.getLogger(logger)
    selected.addHandler(handler)
    selected.setLevel(logging.INFO)
    try:
        yield
    finally:
        selected.removeHandler(handler)
