"""What the mailbox, blob and worker tests check on a backend's tables, through its hooks (probes.py).

`inconsistencies()` is record 23's recomputation in miniature: the counters against a recount from the
source of truth (imap_uid_table), and the projection (message_id_table) against the source of truth.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from mailq_runtime.mailbox import SEEN

from .backends import Backend

AGENT = Path(__file__).with_name("mailbox_agent.py")


@dataclass
class Inconsistencies:
    # mailbox id -> ((count, unseen) in mailbox_counters, (count, unseen) recounted from imap_uid_table)
    counters: dict[str, tuple[tuple[int, int], tuple[int, int]]] = field(default_factory=dict)
    # (mailbox id, uid, message id, flags) rows found only in the source of truth / only in the projection
    missing_from_projection: set[tuple] = field(default_factory=set)
    only_in_projection: set[tuple] = field(default_factory=set)

    def __bool__(self) -> bool:
        return bool(self.counters or self.missing_from_projection or self.only_in_projection)


def inconsistencies(backend: Backend) -> Inconsistencies:
    found = Inconsistencies()
    state = backend.mailbox_state()
    source = state.source_of_truth
    recounted = dict.fromkeys(state.mailboxes, (0, 0))
    for mailbox, _, _, flags in source:
        count, unseen = recounted.get(mailbox, (0, 0))
        recounted[mailbox] = (count + 1, unseen + (SEEN not in flags.split()))
    stored = state.counters
    for mailbox in recounted.keys() | stored.keys():
        if stored.get(mailbox) != recounted.get(mailbox):
            found.counters[mailbox] = (stored.get(mailbox), recounted.get(mailbox))
    projection = state.projection
    found.missing_from_projection = source - projection
    found.only_in_projection = projection - source
    return found


def assert_message_blobs_referenced(backend: Backend, left_over: frozenset[str] = frozenset()) -> None:
    """Every stored message's header and body are referenced by its message id, and by nothing else
    of the mailboxes: a message in no mailbox has neither row nor references, unless an operation died
    before releasing them (`left_over`: the orphan sweep's to release)."""
    held = backend.blob_state().held()
    state = backend.mailbox_state()
    messages = state.messages
    assert set(messages) == state.placed() | left_over
    for message_id, (header, body) in messages.items():
        assert held.get(message_id) == {header, body}, message_id


def agent(backend: Backend, *arguments: object, grouped: bool = True) -> subprocess.Popen:
    """Another process on the same deployment (see mailbox_agent.py); `grouped=False`: every write of its
    core commits alone."""
    flags = [] if grouped else ["--ungrouped"]
    return subprocess.Popen(
        [sys.executable, str(AGENT), backend.url(), *flags, *map(str, arguments)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def results(processes: list[subprocess.Popen], timeout: float = 60) -> list[str]:
    """Starts the agents' work together once each is ready, then returns the stdout of each, failing the
    test on a non-zero exit or once `timeout` seconds pass."""
    # An agent that failed before it was ready has exited: it gets no go, and communicate() reports it.
    ready = [process for process in processes if process.stdout.readline() == "ready\n"]
    for process in ready:
        process.stdin.write("go\n")
        process.stdin.flush()
    outputs = []
    for process in processes:
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for other in processes:
                other.kill()
            raise
        assert process.returncode == 0, err
        outputs.append(out)
    return outputs
