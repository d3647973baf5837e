"""Record 32's content clean-up: what lies between content_start and browse_start is released and
deleted."""

from __future__ import annotations

from ..blobs.dedup import DeduplicatingBlobStore
from ..faults import CLEAN_AFTER_DELETE, CLEAN_AFTER_RELEASE, FaultInjector
from ..stores.protocols import DeadLetters, QueueView
from .context import QueueContext, QueuePart


class ContentCleanUp(QueuePart):
    def __init__(
        self,
        context: QueueContext,
        *,
        view: QueueView,
        blobs: DeduplicatingBlobStore,
        dead_letters: DeadLetters,
        faults: FaultInjector,
    ) -> None:
        super().__init__(context)
        self.view = view
        self.blobs = blobs
        self.dead_letters = dead_letters
        self.faults = faults

    def clean_content(self) -> int:
        """Record 32: release and delete what lies between content_start and browse_start, then move
        content_start. Returns the number of rows deleted.

        Crash-safe order: 1. release the references of the slices' mails (not those of dead letters,
        which keep their content); 2. delete the slices' rows; 3. move content_start. A crash after 1 or
        2 leaves content_start behind, so the next call does it again: releasing a released owner and
        deleting deleted rows change nothing."""
        content_start = self.context.created(self.view.content_start(self.name))
        browse_start = self.context.created(self.view.browse_start(self.name))
        if content_start >= browse_start:
            return 0
        dead = {letter.enqueue_id for letter in self.dead_letters.list(self.name)}
        for enqueue_id in self.view.mails_before(self.name, content_start, browse_start):
            if enqueue_id not in dead:
                self.blobs.release(enqueue_id)
        self.faults.reached(CLEAN_AFTER_RELEASE)
        removed = self.view.delete_slices(self.name, content_start, browse_start)
        self.faults.reached(CLEAN_AFTER_DELETE)
        self.view.advance_content_start(self.name, browse_start)
        return removed
