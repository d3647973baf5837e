"""`make ui`'s launcher: `dagster dev` that stops within seconds on Ctrl-C or SIGTERM.

dagster dev maps SIGTERM to its SIGINT handler, and a process started in the background of a
non-interactive shell inherits SIGINT ignored: such a dagster dev ignores both, and its webserver, daemon
and code server outlive any signal but SIGKILL. This launcher starts it with both signals at their
defaults, in a process group of its own, passes a SIGINT or SIGTERM on to that group as SIGINT (dagster
dev's own shutdown), and kills the group if it is not gone within GRACE_SECONDS.

    python -m mailq_demo.ui -w workspace.yaml -h 127.0.0.1    # the arguments of `dagster dev`
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

# How long dagster dev and its children may take to stop once asked; then they are killed. Its own
# shutdown waits up to a minute for each child.
GRACE_SECONDS = 5.0


def _signals_at_defaults() -> None:
    # In the child, before exec: a default disposition survives exec, an ignored one would too.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def _stop(group: int, child: subprocess.Popen) -> None:
    """Ask the group to stop, then kill what is left after GRACE_SECONDS."""
    os.killpg(group, signal.SIGINT)
    deadline = time.monotonic() + GRACE_SECONDS
    while time.monotonic() < deadline:
        child.poll()  # reaped, so that a stopped dagster dev no longer counts in its group
        if not _group_alive(group):
            return
        time.sleep(0.1)
    os.killpg(group, signal.SIGKILL)


def main(argv: Sequence[str]) -> int:
    dagster = Path(sys.executable).with_name("dagster")
    child = subprocess.Popen(
        [str(dagster), "dev", *argv], start_new_session=True, preexec_fn=_signals_at_defaults
    )
    asked = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: asked.set())
    while child.poll() is None and not asked.wait(0.5):
        pass
    if asked.is_set():
        _stop(child.pid, child)
    child.wait()
    return 0 if asked.is_set() else child.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
