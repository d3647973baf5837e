"""Grouping of writes, owned by the deployment: one object each deployment supplies, handed once to the
core inside the collaborators it builds (runtime.py).

An optimisation, never a correctness need: the core orders the writes of every path so that each may
commit alone (as on Cassandra). `writes()` may group the writes of one step, so that a deployment able to
do so commits them at once; `turn()` holds the store over a whole queue operation, its reads and its own
work included, so that the threads of a process take turns rather than hand the GIL and the connection
back and forth between their statements. The embedded deployment's are its store's transaction (which
also holds the turn, see stores/embedded/store.py) and turn; any other deployment's do nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Protocol


class UnitOfWork(Protocol):
    def writes(self) -> AbstractContextManager: ...

    def turn(self) -> AbstractContextManager: ...


@dataclass(frozen=True)
class GroupedWork:
    """A store's grouping: its transaction and its turn."""

    writes: Callable[[], AbstractContextManager]
    turn: Callable[[], AbstractContextManager]


# Every call commits on its own: a deployment that cannot group, or a runtime opened with
# `group_writes=False` (tests use it to see every write commit alone).
UNGROUPED = GroupedWork(nullcontext, nullcontext)
