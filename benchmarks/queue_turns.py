"""The throughput phases of queue_throughput.py on one runtime, beside the floors of a distributed
deployment (queue_floor.py): each phase in rounds of turns, every side going first in turn, the
single-thread phases timed by backend call, and each turn's CPU by process when a meter is given.

Not a benchmark itself; imported by queue_throughput.py.
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from call_timings import Timings
from process_cpu import CpuMeter
from queue_phases import WARM_UP_MAILS, dequeue_phase, enqueue_phase, message, run_threads, warm_up

from mailq_runtime import Runtime
from mailq_runtime.blobs.store import BlobStore
from mailq_runtime.brokers.base import Broker
from mailq_runtime.clock import MICROS_PER_SECOND
from mailq_runtime.queue import slice_of
from mailq_runtime.stores.protocols import BlobTables, DelayedMails, QueueView

if TYPE_CHECKING:
    from queue_floor import Floor, FloorMail

# With a floor, each phase alternates it with mailq in this many rounds.
ROUNDS = 10
# Seconds of the idle turn that starts each round with a CPU meter: the background's rate.
IDLE_TURN = 1.0
# The sides of a phase with a floor: mailq, the floor of its calls, the James-like floor (JamesFloor).
SIDES = ("mailq", "floor", "james")
# The runtime's backends whose calls the breakdown times, by the protocol that lists their methods.
TIMED = {
    "view": QueueView,
    "blob_tables": BlobTables,
    "content": BlobStore,
    "broker": Broker,
    "delayed_mails": DelayedMails,
}


def profiled(enabled: bool, phase: Callable[[], tuple[list[float], float]]) -> tuple[list[float], float]:
    """Run `phase`, under cProfile if asked: the top costs go to stderr, the figures stay on stdout."""
    if not enabled:
        return phase()
    profile = cProfile.Profile()
    measured = profile.runcall(phase)
    pstats.Stats(profile, stream=sys.stderr).sort_stats("tottime").print_stats(20)
    return measured


@contextmanager
def timed_calls(runtime: Runtime, timings: Timings) -> Iterator[None]:
    """Time every backend call of `runtime` by kind (`view.insert`, `content.put` ...) while inside; a
    call made by another backend call counts in the outer one only. For one thread at a time."""
    depth = [0]
    wrapped = []

    def timer(kind: str, call: Callable) -> Callable:
        def timed(*args, **kwargs):
            depth[0] += 1
            started = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                depth[0] -= 1
                if depth[0] == 0:
                    timings.add(kind, time.perf_counter() - started)

        return timed

    for attribute, protocol in TIMED.items():
        backend = getattr(runtime, attribute)
        for name in vars(protocol):
            method = getattr(backend, name, None)
            if not name.startswith("_") and callable(method):
                setattr(backend, name, timer(f"{attribute}.{name}", method))
                wrapped.append((backend, name, method))
    try:
        yield
    finally:
        # The method as it was, the metrics' counting wrapper (deployments.py's `_count_calls`) included.
        for backend, name, method in wrapped:
            setattr(backend, name, method)


def check_emptied(runtime: Runtime, name: str) -> None:
    queue = runtime.queue(name)
    if queue.size() != 0:
        raise AssertionError(f"{queue.size()} mails left after dequeuing all of them")


def floor_enqueue_phase(
    floor: Floor, enqueue: Callable[[FloorMail], None], queue: str, mails: int, size: int, threads: int
) -> tuple[list[float], float]:
    """`enqueue` (the floor's or the James-like floor's) of `mails` mails made by the floor."""
    slice_start = slice_of(time.time_ns() // 1000, 3600 * MICROS_PER_SECOND)
    floor.create_queue(queue, slice_start)
    prepared = [floor.new_mail(queue, slice_start, message(size), i) for i in range(mails)]
    return run_threads(threads, mails, lambda i: enqueue(prepared[i]))


def floor_dequeue_phase(
    dequeue_done: Callable[[str], None], queue: str, mails: int, threads: int
) -> tuple[list[float], float]:
    return run_threads(threads, mails, lambda _: dequeue_done(queue))


class Phases:
    """The throughput phases on one runtime. With a floor (Cassandra), each phase alternates mailq, the floor
    of its calls and the James-like floor in ROUNDS rounds, each going first in turn, so that whatever else
    loads the machine and the servers meanwhile weighs on all alike; the single-thread phases are timed by
    call kind, and with a CPU meter every turn's CPU time is added up by side and phase, per process."""

    def __init__(
        self,
        runtime: Runtime,
        floor: Floor | None,
        prefix: str,
        size: int,
        threads: int,
        profile: str | None,
        meter: CpuMeter | None = None,
    ):
        self.runtime = runtime
        self.prefix = prefix
        self.floor = floor
        self.james = None
        if floor is not None:
            from queue_floor import JamesFloor

            self.james = JamesFloor(floor)
        self.size = size
        self.threads = threads
        self.profile = profile
        self.meter = meter
        self.measured: dict[str, tuple[list[float], float]] = {}
        self.timings = {side: {"enqueue": Timings(), "dequeue": Timings()} for side in SIDES}

    def throughput(self, mails: int, single: int) -> None:
        runtime, floor, james, size, threads = self.runtime, self.floor, self.james, self.size, self.threads
        one, many = f"{self.prefix}throughput-1", f"{self.prefix}throughput-{threads}"
        if floor is not None:
            self.warm_up()
        self.both(
            "single_enqueue",
            single,
            {
                "floor": lambda n: floor_enqueue_phase(floor, floor.enqueue, "floor-1", n, size, 1),
                "james": lambda n: floor_enqueue_phase(floor, james.enqueue, "james-1", n, size, 1),
            },
            lambda n: enqueue_phase(runtime, one, n, size, 1),
            "enqueue",
        )
        self.both(
            "single_dequeue",
            single,
            {
                "floor": lambda n: floor_dequeue_phase(floor.dequeue_done, "floor-1", n, 1),
                "james": lambda n: floor_dequeue_phase(james.dequeue_done, "james-1", n, 1),
            },
            lambda n: dequeue_phase(runtime, one, n, 1),
            "dequeue",
        )
        check_emptied(runtime, one)
        name, named = f"floor-{threads}", f"james-{threads}"
        self.both(
            "enqueue",
            mails,
            {
                "floor": lambda n: floor_enqueue_phase(floor, floor.enqueue, name, n, size, threads),
                "james": lambda n: floor_enqueue_phase(floor, james.enqueue, named, n, size, threads),
            },
            lambda n: profiled(
                self.profile == "enqueue", lambda: enqueue_phase(runtime, many, n, size, threads)
            ),
        )
        self.both(
            "dequeue",
            mails,
            {
                "floor": lambda n: floor_dequeue_phase(floor.dequeue_done, name, n, threads),
                "james": lambda n: floor_dequeue_phase(james.dequeue_done, named, n, threads),
            },
            lambda n: profiled(self.profile == "dequeue", lambda: dequeue_phase(runtime, many, n, threads)),
        )
        check_emptied(runtime, many)

    def warm_up(self) -> None:
        """Statements prepared, connections opened and the first generation made, by every side."""
        assert self.floor is not None and self.james is not None
        self.floor.prepare()
        self.james.prepare()
        for enqueue, dequeue_done, queue in (
            (self.floor.enqueue, self.floor.dequeue_done, "floor-warm-up"),
            (self.james.enqueue, self.james.dequeue_done, "james-warm-up"),
        ):
            floor_enqueue_phase(self.floor, enqueue, queue, WARM_UP_MAILS, self.size, 1)
            floor_dequeue_phase(dequeue_done, queue, WARM_UP_MAILS, 1)
        warm_up(self.runtime, f"{self.prefix}warm-up", self.size)

    def both(
        self,
        phase: str,
        mails: int,
        of_floors: dict[str, Callable],
        of_mailq: Callable,
        timed: str | None = None,
    ) -> None:
        """`mails` through mailq (and through each floor, in turns); `timed` names the operation whose calls
        are timed by kind."""
        sides = ["mailq"] if self.floor is None else list(SIDES)
        rounds = 1 if self.floor is None else ROUNDS
        for number in range(rounds):
            count = mails * (number + 1) // rounds - mails * number // rounds
            if self.meter is not None:
                self.meter.idle(IDLE_TURN)
            # Each side goes first in turn.
            shift = number % len(sides)
            for side in sides[shift:] + sides[:shift]:
                self._turn(side, phase, count, of_mailq if side == "mailq" else of_floors[side], timed)

    def _turn(self, side: str, phase: str, count: int, of_side: Callable, timed: str | None) -> None:
        key = phase if side == "mailq" else f"{side}_{phase}"
        timings = self.timings[side][timed] if timed else None
        if self.meter is not None:
            self.meter.start()
        if side == "mailq":
            if timings is None:
                measured = of_side(count)
            else:
                with timed_calls(self.runtime, timings):
                    measured = of_side(count)
        else:
            assert self.floor is not None
            self.floor.timings = timings
            measured = of_side(count)
            self.floor.timings = None
        if self.meter is not None:
            self.meter.stop(key)
        self._add(key, measured)

    def _add(self, phase: str, measured: tuple[list[float], float]) -> None:
        latencies, wall = self.measured.get(phase, ([], 0.0))
        self.measured[phase] = (latencies + measured[0], wall + measured[1])
