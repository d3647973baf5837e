"""The store's blocking calls of `mailq smtp`'s sessions, on a few long-lived threads, so that the other
sessions keep flowing while one waits for its sync.

Each call is answered on the event loop by one `call_soon_threadsafe` setting its caller's future, rather
than `run_in_executor`'s concurrent future chained to an asyncio one (their locks, callbacks and copied
state, twice a mail: the recipient's look-up and the enqueue)."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
_Call = tuple[asyncio.AbstractEventLoop, asyncio.Future, Callable[..., Any], tuple[Any, ...]]


class BlockingCalls:
    """`threads` threads taking calls in turn until `shutdown`, which lets the calls under way finish."""

    def __init__(self, threads: int, name: str) -> None:
        self.calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self.threads = [
            threading.Thread(target=self._serve, name=f"{name}_{number}", daemon=True)
            for number in range(threads)
        ]
        for thread in self.threads:
            thread.start()

    async def run(self, call: Callable[..., T], *arguments: Any) -> T:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self.calls.put((loop, future, call, arguments))
        return await future

    def _serve(self) -> None:
        while (taken := self.calls.get()) is not None:
            loop, future, call, arguments = taken
            try:
                result = call(*arguments)
            # Whatever the call raised is its caller's to see: a thread ended by it would leave the
            # session's future pending for ever and the calls one thread short.
            except BaseException as error:
                loop.call_soon_threadsafe(_settle, future, None, error)
            else:
                loop.call_soon_threadsafe(_settle, future, result, None)

    def shutdown(self) -> None:
        for _ in self.threads:
            self.calls.put(None)
        for thread in self.threads:
            thread.join()


def _settle(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    # A session gone meanwhile cancelled its future: the call's outcome has no one to go to.
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
