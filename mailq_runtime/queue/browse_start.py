"""The queue's maintenance (records 31 and 32): browse_start, how far it may go, when it moves, and the
content clean-up that follows it."""

from __future__ import annotations

import logging
import random

from ..faults import CLEAN_AFTER_BROWSE_START, FaultInjector
from ..stores.protocols import QueueView
from .clean_up import ContentCleanUp
from .context import QueueContext, QueuePart, slice_of

log = logging.getLogger(__name__)


class BrowseStart(QueuePart):
    def __init__(
        self, context: QueueContext, *, view: QueueView, faults: FaultInjector, clean_up: ContentCleanUp
    ) -> None:
        super().__init__(context)
        self.view = view
        self.faults = faults
        self.clean_up = clean_up
        self.random = random.Random()

    def browse_start(self) -> int:
        return self.context.created(self.view.browse_start(self.name))

    def content_start(self) -> int:
        return self.context.created(self.view.content_start(self.name))

    def due(self) -> bool:
        """An update has work: a clean-up left unfinished, or browse_start can advance by two slices or
        more. A lag that a live mail holds back is not due: an update could not move browse_start past
        it, and a run asked for again and again would clean nothing."""
        browse_start = self.browse_start()
        worth_a_run = 2 * self.context.configurations.widest_slice_window()
        return self.content_start() < browse_start or self.next_start() - browse_start >= worth_a_run

    def maybe_update(self) -> None:
        # Random piggy-backing (record 31): no coordination between nodes, and liveness on average.
        # It runs after the operation that triggered it is written, so its failure must not fail that
        # operation; content_start stays behind and the next update redoes the clean-up.
        if self.random.random() * self.context.configuration.update_browse_start_pace < 1:
            try:
                self.update_browse_start()
            except Exception:
                log.warning(
                    "browse_start update of queue %s failed; the next one retries it",
                    self.name,
                    exc_info=True,
                )

    def browse_start_limit(self) -> int:
        """The newest slice browse_start may reach: the current one minus the clock-skew grace, aligned on
        the widest sliceWindow ever in force. A process still holding an older, wider window writes its mails
        into the slice of that window, which may start before the current slice of a narrower one; were
        browse_start past it, those mails would be invisible to browse, size, remove and clear, and their rows
        would stay behind content_start for ever."""
        context = self.context
        window = max(context.configurations.widest_slice_window(), context.configuration.slice_window)
        return slice_of(context.clock() - context.clock_skew_grace, window)

    def next_start(self) -> int:
        """Where an update would move browse_start: the first slice from it that holds a live mail, or the
        limit when none before it does."""
        limit = self.browse_start_limit()
        for slice_start in self.view.slices_from(self.name, self.browse_start()):
            if slice_start >= limit:
                break
            if self.view.live_mails(self.name, slice_start):
                return slice_start
        return limit

    def update_browse_start(self) -> int:
        """Advance browse_start to the first slice holding a live mail (never past the current slice minus
        the clock-skew grace), then clean content_start .. browse_start. Returns the new browse_start.

        Crash-safe order: 1. advance browse_start; 2. the clean-up (`clean_content`). A crash after 1
        leaves content_start behind, and the next update or clean-up does the work."""
        new_start = self.next_start()
        if new_start > self.browse_start():
            self.view.advance_browse_start(self.name, new_start)
        self.faults.reached(CLEAN_AFTER_BROWSE_START)
        self.clean_up.clean_content()
        return self.browse_start()
