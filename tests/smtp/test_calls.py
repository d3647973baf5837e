"""The threads of the sessions' blocking calls: a result or an error back to its caller on the loop, a
caller gone meanwhile, and a shutdown that lets the calls under way finish."""

from __future__ import annotations

import asyncio
import threading

import pytest

from mailq_runtime.smtp.calls import BlockingCalls
from mailq_runtime.smtp.server import run


def test_a_call_returns_its_result_or_raises_its_error_in_its_caller():
    calls = BlockingCalls(2, "test-calls")

    def fails() -> None:
        raise OSError("disk full")

    async def calling() -> list[object]:
        results: list[object] = list(await asyncio.gather(*(calls.run(pow, 2, n) for n in range(20))))
        with pytest.raises(OSError, match="disk full"):
            await calls.run(fails)
        results.append(await calls.run(threading.current_thread))
        return results

    try:
        *powers, thread = run(calling())
    finally:
        calls.shutdown()
    assert powers == [2**n for n in range(20)]
    assert thread.name.startswith("test-calls_") and not thread.is_alive()


def test_a_caller_gone_meanwhile_leaves_the_call_to_finish_and_the_shutdown_waits_for_it():
    calls = BlockingCalls(1, "test-calls")
    started, release, finished = threading.Event(), threading.Event(), threading.Event()

    def slow() -> None:
        started.set()
        release.wait(10)
        finished.set()

    async def calling() -> None:
        waiting = asyncio.ensure_future(calls.run(slow))
        while not started.is_set():
            await asyncio.sleep(0.001)
        waiting.cancel()
        release.set()
        await asyncio.get_running_loop().run_in_executor(None, calls.shutdown)

    run(calling())
    assert finished.is_set()


def test_a_call_ending_in_a_base_exception_raises_it_in_its_caller_and_its_thread_serves_on():
    calls = BlockingCalls(1, "test-calls")

    class Ended(BaseException):
        pass

    def ends() -> None:
        raise Ended("not an Exception")

    async def calling() -> int:
        with pytest.raises(Ended):
            await asyncio.wait_for(calls.run(ends), 5)
        return await asyncio.wait_for(calls.run(pow, 2, 5), 5)

    try:
        assert run(calling()) == 32
    finally:
        calls.shutdown()
