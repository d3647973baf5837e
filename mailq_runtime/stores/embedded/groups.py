"""The open transaction that several turns of the embedded store share (store.py's group commit, which
combining.py's hand-over fills), and the bound on it."""

from __future__ import annotations

import sqlite3
import threading

# Turns one commit serves at most: bounds how long the first of them waits for its acknowledgement.
GROUP_LIMIT = 64


class Group:
    """The open transaction several turns share, and its outcome."""

    __slots__ = ("members", "done", "error", "synced")

    def __init__(self) -> None:
        self.members = 0
        self.done: threading.Event | None = None  # made by the first member to wait
        self.error: sqlite3.Error | OSError | None = None
        self.synced = False  # a member promises durability: the commit is followed by a sync
