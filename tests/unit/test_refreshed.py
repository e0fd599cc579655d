"""A value read from the database that a reader never waits for
(:mod:`messaging.runtime._refreshed`): the first ask waits ``first`` seconds at most, a
read that hangs shows as the time it has waited, an error as the error, and the thread
stops once nobody asks."""

from __future__ import annotations

import threading

from messaging.operations import Refreshed


def test_a_hung_read_is_reported_as_waiting_and_never_waited_for() -> None:
    release = threading.Event()
    reads = []

    def read() -> int:
        reads.append(threading.current_thread().name)
        if len(reads) == 2:
            release.wait(30)  # the second read hangs until released
        return len(reads)

    kept: Refreshed[int] = Refreshed(read, name="test-read", interval=0.01, first=5.0)
    first = kept.get()
    assert (first.value, first.error) == (1, None)  # the first ask waited for it
    while len(reads) < 2:
        threading.Event().wait(0.01)
    hung = kept.get()  # at once: the last value, and how long the read under way waits
    assert hung.value == 1 and hung.waiting >= 0.0 and hung.age >= hung.waiting
    threading.Event().wait(0.05)
    assert kept.get().waiting >= 0.05
    release.set()
    while (kept.get().value or 0) < 2:
        threading.Event().wait(0.01)
    assert set(reads) == {"test-read"}


def test_an_error_is_the_reading_and_the_thread_stops_when_unasked() -> None:
    def read() -> int:
        raise ConnectionError("refused")

    kept: Refreshed[int] = Refreshed(read, name="test-error", interval=0.01, idle=0.05)
    reading = kept.get()
    assert reading.value is None and isinstance(reading.error, ConnectionError)
    threading.Event().wait(0.3)
    assert not any(t.name == "test-error" for t in threading.enumerate())
