"""Delayed mails as records of the metadata store, so that every broker offers delays of any length and a
working flush: a mail is held here, keyed by its due time, until a publisher hands it to the broker
(`MailQueue.publish_due`).

Every store implements the same small interface, `DelayedMails` (stores/embedded_delayed_mails.py). A
delayed mail is keyed by (queue, due, enqueue id): the same mail delayed again (a retry) is a second record.

- add(mail): hold it until `mail.due`; adding it again changes nothing.
- due(queue, now, limit): at most `limit` of the queue's mails due at `now` or earlier, by due time
  then enqueue id: what the publisher publishes next.
- remove(mail): drop it once published (nothing if absent), so publishing is at-least-once.
- all(queue): every mail the queue holds, in the same order, for a flush.
- summary(queue, now): how many wait (due after `now`) and how many fell due and wait for a publisher,
  with the smallest enqueue id (the oldest mail) of each and the next due time, counted by the store
  without reading the payloads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class DelayedMail:
    queue: str
    enqueue_id: str
    due: int
    priority: int
    payload: str


@dataclass(frozen=True)
class DelayedSummary:
    waiting: int  # due after `now`
    oldest_waiting: str | None  # the smallest enqueue id among them
    next_due: int | None
    fallen_due: int  # due at `now` or earlier, not handed to the broker yet


class DelayedMails(Protocol):
    def add(self, mail: DelayedMail) -> None: ...
    def due(self, queue: str, now: int, limit: int) -> list[DelayedMail]: ...
    def remove(self, mail: DelayedMail) -> None: ...
    def all(self, queue: str) -> list[DelayedMail]: ...
    def summary(self, queue: str, now: int) -> DelayedSummary: ...
