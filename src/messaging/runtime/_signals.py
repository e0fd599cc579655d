"""SIGTERM and SIGINT, recorded by a handler that takes no lock.

A handler runs in the main thread between two bytecodes, wherever that thread is: an
``Event.set()`` (or a log line, a thread start) in it deadlocks when the signal lands
while the main thread holds the same lock, e.g. inside that event's own ``wait()`` in a
polling loop. So the handler only records which signal came; the main thread polls for
it (:data:`POLL`) and acts outside the handler.
"""

from __future__ import annotations

import signal
from types import FrameType, TracebackType

POLL = 0.05
"""Seconds between two looks at the record, in the main thread's waits."""


class StopSignals:
    """A context manager: while inside, SIGTERM and SIGINT set :attr:`received` (the last
    one's name) and nothing else; the previous handlers come back at the end."""

    def __init__(self) -> None:
        self.received: str | None = None
        self._previous: dict[int, object] = {}

    def _record(self, signum: int, _frame: FrameType | None) -> None:
        self.received = signal.Signals(signum).name

    def __enter__(self) -> StopSignals:
        for signum in (signal.SIGTERM, signal.SIGINT):
            self._previous[signum] = signal.signal(signum, self._record)
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _value: BaseException | None,
        _traceback: TracebackType | None,
    ) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]  # what signal.signal gave
