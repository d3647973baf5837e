"""Dead letters as records of the metadata store, like James's mail repositories: a queue's mails that will
never be delivered, each with its reason and its broker payload (and so its content's blob ids, whose
references its enqueue id keeps), until an operator requeues or purges it.

Every store implements the same small interface, `DeadLetters` (stores/embedded_dead_letters.py). A letter
is keyed by its queue and enqueue id: adding one again replaces it, so dead-lettering is idempotent, and a
queue's letters are listed by enqueue id, which is enqueue order. `summary` and `reasons` read a queue's
letters without their payloads, for the overviews an operator reads.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class DeadLetter:
    queue: str
    enqueue_id: str
    reason: str
    died_at: int
    payload: str


@dataclass(frozen=True)
class DeadLetterSummary:
    count: int
    oldest_died_at: int | None  # None when there is none


class DeadLetters(Protocol):
    def add(self, letter: DeadLetter) -> None: ...
    def list(self, queue: str) -> builtins.list[DeadLetter]: ...
    def get(self, queue: str, enqueue_id: str) -> DeadLetter | None: ...
    def remove(self, queue: str, enqueue_id: str) -> None: ...
    def summary(self, queue: str) -> DeadLetterSummary:
        """How many letters the queue holds and when the longest-kept one died."""
        ...

    def reasons(self, queue: str) -> builtins.list[tuple[str, int]]:
        """(reason, died_at) of each of the queue's letters."""
        ...
