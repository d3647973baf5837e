"""Grouping of writes, owned by the deployment: one object each deployment supplies, handed once to the
core inside the collaborators it builds (runtime.py).

An optimisation, never a correctness need: the core orders the writes of every path so that each may
commit alone (as on Cassandra). `writes()` may group the writes of one step, so that a deployment able to
do so commits them at once; `turn()` holds the store over a whole queue operation, its reads and its own
work included, so that the threads of a process take turns rather than hand the GIL and the connection
back and forth between their statements; `in_turn(operation)` runs a whole operation in the turn, which
lets the thread holding it run the operations of threads waiting for it (one handover of the turn for a
group); `in_group(item, write)` is `write([item])[0]`, which the holder of the turn may run as one `write`
of the items of several threads (a group of enqueues, one statement a table). The embedded deployment's
are its store's transaction (which also holds the turn, see stores/embedded/store.py), turn, `in_turn`
and `in_group`; any other deployment's do nothing but call.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class UnitOfWork(Protocol):
    def writes(self) -> AbstractContextManager: ...

    def turn(self) -> AbstractContextManager: ...

    def in_turn(self, operation: Callable[[], T]) -> T: ...

    def in_group(self, item: Any, write: Callable[[list[Any]], list[T]]) -> T: ...


@dataclass(frozen=True)
class GroupedWork:
    """A store's grouping: its transaction, its turn, and its operations run in the turn."""

    writes: Callable[[], AbstractContextManager]
    turn: Callable[[], AbstractContextManager]
    in_turn: Callable[[Callable[[], Any]], Any]
    in_group: Callable[[Any, Callable[[list[Any]], list[Any]]], Any]


def _alone(operation: Callable[[], T]) -> T:
    return operation()


def _one(item: Any, write: Callable[[list[Any]], list[T]]) -> T:
    return write([item])[0]


# Every call commits on its own: a deployment that cannot group, or a runtime opened with
# `group_writes=False` (tests use it to see every write commit alone).
UNGROUPED = GroupedWork(nullcontext, nullcontext, _alone, _one)
