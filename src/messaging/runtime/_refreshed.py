"""A value read from the database that a reader never waits for: probes and metrics answer
from memory at once, whatever the database does (Kubernetes' probes and Prometheus' scrapes
time out, and an exporter answers from memory).

:class:`Refreshed` keeps the latest result of a read, refreshed by a thread of its own
every ``interval`` while it is asked for (it stops ``idle`` seconds after the last ask);
a reader gets a :class:`Reading`: what the last read that ended returned (or raised), how
old it is, and how long the read under way has waited for the database.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

import attrs

log = logging.getLogger("messaging.runtime.refreshed")

T = TypeVar("T")


@attrs.frozen
class Reading(Generic[T]):
    """What a :class:`Refreshed` holds when asked."""

    value: T | None
    """What the last read that ended returned (None: none has, or it raised)."""
    error: BaseException | None
    """What the last read that ended raised (None: it returned)."""
    age: float
    """Seconds since the last read that ended started (infinite: none has ended)."""
    waiting: float
    """Seconds the read under way has waited for the database (0: none is under way)."""


class Refreshed(Generic[T]):
    """The latest result of ``read``, kept while asked for (see the module)."""

    def __init__(
        self,
        read: Callable[[], T],
        *,
        name: str,
        interval: float = 1.0,
        idle: float = 60.0,
        first: float = 0.5,
    ) -> None:
        self._read, self.name = read, name
        self.interval, self.idle, self.first = interval, idle, first
        self._lock = threading.Lock()
        self._value: T | None = None
        self._error: BaseException | None = None
        self._read_at: float | None = None
        self._started: float | None = None
        """When the read under way started (None: none is)."""
        self._asked = 0.0
        self._thread: threading.Thread | None = None
        self._ended = threading.Event()
        """Set when a read ends."""

    def get(self) -> Reading[T]:
        """The latest reading; the first ask starts the thread and waits up to ``first``
        seconds for its first read (a healthy database answers by then)."""
        with self._lock:
            self._asked = time.monotonic()
            if self._thread is None:
                self._ended.clear()
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            fresh = self._read_at is not None
        if not fresh:
            self._ended.wait(self.first)
        with self._lock:
            now = time.monotonic()
            return Reading(
                self._value,
                self._error,
                now - self._read_at if self._read_at is not None else float("inf"),
                now - self._started if self._started is not None else 0.0,
            )

    def _run(self) -> None:
        while True:
            with self._lock:
                if time.monotonic() - self._asked > self.idle:
                    self._thread = None
                    return
                started = self._started = time.monotonic()
            try:
                value, error = self._read(), None
            except Exception as exc:
                value, error = None, exc
            with self._lock:
                self._value, self._error = value, error
                self._read_at, self._started = started, None
            self._ended.set()
            time.sleep(self.interval)
